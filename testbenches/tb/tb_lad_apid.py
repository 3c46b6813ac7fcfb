"""cocotb: LAD APID (hdl/lad/apid.py) alone == golden.lad_tile.LadTileModel's APID (docs/algorithms.md §1.4:
x^_i = s^_i - m against the guarded bounds of mode r*_i; quiet positions bump their mode
counter, halving on saturation; candidates to MD), bit-exact.

The bench plays the tile sequencer, EAS and MD from the golden trace: per step (position n)
pass A (``scan`` classify 0, random ``m`` that must be ignored) answers each ``lookup`` with the
golden s^_i (checking the lookups' center and rho) and checks ``smax``; pass B (classify 1, the
golden m) checks every ``cand`` (position, mode, counters: the metadata APID stored, bumped and
wrote back from earlier verdicts) and answers with the golden MD verdict, then checks ``done``;
``absorb`` writes position n. Random gaps on scan/approx/verdict/absorb, back-pressure on
lookup/smax/cand/done, random EAS and MD latency. With ``group`` g > 1, g query heads' models (one
each, the same keys): each lookup answered with every head's s^, each head's m, smax, candidates
(its own ``cand`` / ``verdict`` streams and MD, each at its own random latency), done count and
absorbed mode.
"""
from __future__ import annotations

import cocotb
from amaranth import unsigned

from golden.lad_tile import LadTileConfig
from hdl.lad.apid import absorb_layout, scan_layout
from hdl.lad.common import candidate_layout, head_scores_shape, per_head
from hdl.lad.eas import lookup_layout
from testbenches.streams import Bench
from testbenches.tb.lad_steps import golden_records, head_payload, payload_heads, sequence


@cocotb.test()
async def apid_matches_golden(dut):
    bench = await Bench.start(dut, LadTileConfig)
    cfg, rng, g = bench.cfg, bench.rng, bench.cfg.group
    q, k, v = sequence(bench)
    head_recs = [golden_records(cfg, qh, k, v)[1] for qh in (q if g > 1 else q[None])]
    recs = head_recs[0]
    xf, nb = cfg.sfm.x_format, cfg.beats

    approx_queue: list = []
    verdicts: list[dict[int, dict]] = [{} for _ in range(g)]

    def eas_lookup(_req):   # in order: the golden s^ of the next position, every head's
        return approx_queue.pop(0) if approx_queue else head_payload(cfg, [0] * g)

    def md_verdict(h):
        return lambda c: verdicts[h].get(c["position"], c)

    scan_src = bench.source("scan", scan_layout(cfg))
    eas = bench.memory("lookup", lookup_layout(cfg), "approx", head_scores_shape(cfg), eas_lookup, latency=(1, 4))
    smax_sink = bench.sink("smax", head_scores_shape(cfg))
    mds = [bench.memory("cand" if g == 1 else f"cand__{h}", candidate_layout(cfg),
                        "verdict" if g == 1 else f"verdict__{h}", candidate_layout(cfg), md_verdict(h),
                        latency=(nb, 4 * nb)) for h in range(g)]
    done_sink = bench.sink("done", per_head(cfg, unsigned(cfg.position_width)))
    absorb_src = bench.source("absorb", absorb_layout(cfg))

    want_lookups, want_cands = [], [[] for _ in range(g)]
    passes = 0
    smax_passes, probed, corner_lookups = 0, False, 0   # pass A runs (one more than passes: the corner pass)

    async def pass_a(n, lookups, scores, what):
        """Pass A of position n with these approximate scores (per head): the lookups, then each
        head's smax == the max of its scores."""
        nonlocal smax_passes
        smax_passes += 1
        approx_queue[:] = [head_payload(cfg, (s[j] for s in scores)) for j in range(n)]
        want_lookups.extend({"center": c, "rho": r} for c, r in lookups)
        scan_src.put({"length": n, "m": head_payload(cfg, (rng.randint(xf.min_raw, xf.max_raw) for _ in range(g))), "classify": 0})
        await smax_sink.wait_for(smax_passes, timeout_cycles=30 * n + 2000)
        bench.check(what, smax_sink.received[-1][1], head_payload(cfg, (max(s) for s in scores)))

    halved_at: list[dict[int, int]] = [{} for _ in range(g)]   # per head: position -> step of a quiet-bump halving
    halved_seen = changed_seen = 0
    for i, rec in enumerate(recs):
        n, step = rec.n, [hr[i] for hr in head_recs]
        if n and not probed:
            # a corner pass A first (its results are overwritten by the step's own pass A): every
            # approximate score at the format's minimum, so smax is the minimum (the running
            # maximum must start there, not above)
            probed, corner_lookups = True, len(rec.lookups)
            await pass_a(n, rec.lookups, [[xf.min_raw] * n] * g, f"step {n} smax of an all-minimum pass")
        if n:
            passes += 1
            await pass_a(n, rec.lookups, [r.s_hat for r in step], f"step {n} smax")
            for h, r in enumerate(step):
                verdicts[h].clear()
                for pos, mode, counters, verdict in zip(r.cand, r.cand_mode, r.cand_counters, r.md):
                    verdicts[h][pos] = {"position": pos, "mode": verdict.mode, "counters": verdict.counters}
                    want_cands[h].append({"position": pos, "mode": mode, "counters": counters})
                    if pos in halved_at[h]:
                        halved_seen += 1
                    if mode != head_recs[h][pos].r_new:   # recs[i] is position i
                        changed_seen += 1
            scan_src.put({"length": n, "m": head_payload(cfg, (r.m for r in step)), "classify": 1})
            await done_sink.wait_for(passes, timeout_cycles=(30 + 12 * nb) * n + 2000)
            bench.check(f"step {n} done", done_sink.received[-1][1], head_payload(cfg, (len(r.cand) for r in step)))
            for h, r in enumerate(step):
                for pos, mode, c in zip(r.quiet, r.quiet_mode, r.quiet_counters):
                    if c[mode] + 1 > cfg.counter_max:
                        halved_at[h].setdefault(pos, n)
        absorb_src.put({"position": n, "center": rec.center, "rho": rec.rho, "mode": head_payload(cfg, (r.r_new for r in step))})
        await bench.until(lambda: len(absorb_src.sent) == n + 1, 2000, "absorb accepted")
    await bench.settle(50)
    bench.compare("lookup", eas.requests.items, want_lookups)
    for h, md in enumerate(mds):
        bench.compare(f"cand of head {h}", md.requests.items, want_cands[h])
    bench.compare("smax/done count", [len(smax_sink.received), len(done_sink.received)], [smax_passes, passes])
    positions = sum(r.n for r in recs)
    candidates = sum(len(c) for c in want_cands)
    bench.finish(
        vectors=len(recs), steps=len(recs),
        last_position=recs[-1].n, positions=positions, candidates=candidates,
        quiet=g * positions - candidates, lookups=len(want_lookups) - corner_lookups, corner_passes=int(probed),
        all_candidate_steps=sum(1 for hr in head_recs for r in hr if r.n and len(r.cand) == r.n),
        no_candidate_steps=sum(1 for hr in head_recs for r in hr if r.n and not r.cand),
        quiet_halvings=sum(len(h) for h in halved_at), halved_seen=halved_seen, changed_mode_seen=changed_seen,
        max_counter_seen=max((max(c["counters"]) for cs in want_cands for c in cs), default=0),
        nonzero_smax=sum(1 for _, s in smax_sink.received if any(x != 0 for x in payload_heads(cfg, s))),
        # steps at which the heads' candidate sets differ (each head classifies against its own m)
        heads_differ=sum(1 for i in range(len(recs)) if len({tuple(hr[i].cand) for hr in head_recs}) > 1))
