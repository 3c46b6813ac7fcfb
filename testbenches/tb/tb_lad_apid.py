"""cocotb: LAD APID (hdl/lad/apid.py) alone == golden.lad_tile.LadTileModel's APID (docs/algorithms.md §1.4:
x^_i = s^_i - m against the guarded bounds of mode r*_i; quiet positions bump their mode
counter, halving on saturation; candidates to MD), bit-exact.

The bench plays the tile sequencer, EAS and MD from the golden trace: per step (position n)
pass A (``scan`` classify 0, random ``m`` that must be ignored) answers each ``lookup`` with the
golden s^_i (checking the lookups' center and rho) and checks ``smax``; pass B (classify 1, the
golden m) checks every ``cand`` (position, mode, counters: the metadata APID stored, bumped and
wrote back from earlier verdicts) and answers with the golden MD verdict, then checks ``done``;
``absorb`` writes position n. Random gaps on scan/approx/verdict/absorb, back-pressure on
lookup/smax/cand/done, random EAS and MD latency.
"""
from __future__ import annotations

import cocotb
from amaranth import signed, unsigned

from hdl.lad.apid import absorb_layout, scan_layout
from hdl.lad.common import candidate_layout
from hdl.lad.eas import lookup_layout
from testbenches.tb.lad_steps import open_bench


@cocotb.test()
async def apid_matches_golden(dut):
    bench, _, _, recs = await open_bench(dut)
    cfg, rng = bench.cfg, bench.rng
    xf, nb = cfg.sfm.x_format, cfg.beats
    approx_queue: list[int] = []
    verdicts: dict[int, dict] = {}

    def eas_lookup(_req):   # in order: the golden s^ of the next position
        return approx_queue.pop(0) if approx_queue else 0

    def md_verdict(c):
        return verdicts.get(c["position"], c)

    scan_src = bench.source("scan", scan_layout(cfg))
    eas = bench.memory("lookup", lookup_layout(cfg), "approx", signed(xf.width), eas_lookup, latency=(1, 4))
    smax_sink = bench.sink("smax", signed(xf.width))
    md = bench.memory("cand", candidate_layout(cfg), "verdict", candidate_layout(cfg), md_verdict,
                      latency=(nb, 4 * nb))
    done_sink = bench.sink("done", unsigned(cfg.position_width))
    absorb_src = bench.source("absorb", absorb_layout(cfg))

    want_lookups, want_cands = [], []
    passes = 0
    smax_passes, probed, corner_lookups = 0, False, 0   # pass A runs (one more than passes: the corner pass)

    async def pass_a(rec, scores, what):
        """Pass A of position rec.n with these approximate scores: the lookups, then smax == max(scores)."""
        nonlocal smax_passes
        smax_passes += 1
        approx_queue[:] = scores
        want_lookups.extend({"center": c, "rho": r} for c, r in rec.lookups)
        scan_src.put({"length": rec.n, "m": rng.randint(xf.min_raw, xf.max_raw), "classify": 0})
        await smax_sink.wait_for(smax_passes, timeout_cycles=30 * rec.n + 2000)
        bench.check(what, smax_sink.received[-1][1], max(scores))

    halved_at: dict[int, int] = {}   # position -> step of a quiet-bump halving
    halved_seen = changed_seen = 0
    for rec in recs:
        n = rec.n
        if n and not probed:
            # a corner pass A first (its results are overwritten by the step's own pass A): every
            # approximate score at the format's minimum, so smax is the minimum (the running
            # maximum must start there, not above)
            probed, corner_lookups = True, len(rec.lookups)
            await pass_a(rec, [xf.min_raw] * n, f"step {n} smax of an all-minimum pass")
        if n:
            passes += 1
            await pass_a(rec, rec.s_hat, f"step {n} smax")
            verdicts.clear()
            for pos, mode, counters, verdict in zip(rec.cand, rec.cand_mode, rec.cand_counters, rec.md):
                verdicts[pos] = {"position": pos, "mode": verdict.mode, "counters": verdict.counters}
                want_cands.append({"position": pos, "mode": mode, "counters": counters})
                if pos in halved_at:
                    halved_seen += 1
                if mode != recs[pos].r_new:   # recs[i] is position i
                    changed_seen += 1
            scan_src.put({"length": n, "m": rec.m, "classify": 1})
            await done_sink.wait_for(passes, timeout_cycles=(30 + 12 * nb) * n + 2000)
            bench.check(f"step {n} done", done_sink.received[-1][1], len(rec.cand))
            for pos, mode, c in zip(rec.quiet, rec.quiet_mode, rec.quiet_counters):
                if c[mode] + 1 > cfg.counter_max:
                    halved_at.setdefault(pos, n)
        absorb_src.put({"position": n, "center": rec.center, "rho": rec.rho, "mode": rec.r_new})
        await bench.until(lambda: len(absorb_src.sent) == n + 1, 2000, "absorb accepted")
    await bench.settle(50)
    bench.compare("lookup", eas.requests.items, want_lookups)
    bench.compare("cand", md.requests.items, want_cands)
    bench.compare("smax/done count", [len(smax_sink.received), len(done_sink.received)], [smax_passes, passes])
    positions = sum(r.n for r in recs)
    bench.finish(
        vectors=len(recs), steps=len(recs),
        last_position=recs[-1].n, positions=positions, candidates=len(want_cands),
        quiet=positions - len(want_cands), lookups=len(want_lookups) - corner_lookups, corner_passes=int(probed),
        all_candidate_steps=sum(1 for r in recs if r.n and len(r.cand) == r.n),
        no_candidate_steps=sum(1 for r in recs if r.n and not r.cand),
        quiet_halvings=len(halved_at), halved_seen=halved_seen, changed_mode_seen=changed_seen,
        max_counter_seen=max((max(c["counters"]) for c in want_cands), default=0),
        nonzero_smax=sum(1 for _, s in smax_sink.received if s != 0))
