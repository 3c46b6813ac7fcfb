"""cocotb: LAD EAS (hdl/lad/eas.py) alone == golden.lad_tile.LadTileModel's EAS (docs/algorithms.md §1.4:
center update of k_n, rho, s_n; s^_i = rho_i q.c_j(i) / sqrt(d)), bit-exact. With ``group`` g > 1 the
g query heads' models (one each, the same keys) give each head's ``s_n`` and ``s^``; the centers,
their decisions and rho are head 0's (the keys' alone: every head's model has the same).

The bench plays the tile sequencer and the SFM: per golden step it loads q, k_n (``q_load``, ``k_load``: random beat order and gaps), sends
``start``, serves RECIP of a new center's |k|^2 (``recip_req``/``recip_resp``, golden.sfm.recip,
random latency), checks ``key_out`` (center, rho, new_center, s_n) and ``centers``, then sends
APID's lookups of the step (every absorbed position's center and rho) plus random extra
lookups with extreme rho, checking each ``approx`` against ``LadTileModel.approx_scores``.
Random gaps on start/lookup/recip_resp, random back-pressure on key_out/approx/recip_req.
"""
from __future__ import annotations

import cocotb
import torch
from amaranth import unsigned

from golden.lad_tile import COS_FRAC, LadTileConfig, compact_center
from hdl.lad.common import beat_load_layout, head_scores_shape, query_load_layout, recip_resp_layout
from hdl.lad.eas import key_out_layout, lookup_layout
from testbenches.streams import Bench
from testbenches.tb.lad_steps import golden_records, head_payload, load_vector, payload_heads, sequence, sfm_recip


def center_t(model, k: list[int], j: int, half) -> int:
    """EAS's ``t_j = round_shift(dot^2 rc_j, mf + e_j)`` of key ``k`` and center ``j`` with the rounding
    half ``half(shift)`` in place of the model's ``2^(shift - 1)``."""
    rc, e = model.center_recip[j]
    dot, shift = int((model.centers[j] * torch.tensor(k, dtype=torch.int64)).sum()), model.cfg.sfm.mantissa_frac + e
    return (dot * dot * rc + half(shift)) >> shift


def joins_with_half(model, rec, half) -> bool:
    """EAS's join verdict at ``rec``'s step had each ``t_j`` been rounded by adding ``half(shift)``:
    does the stimulus hold steps that t's rounding decides?"""
    cfg, C = model.cfg, rec.centers_before
    best_t = max((center_t(model, rec.k, j, half) for j in range(C)), default=-1)
    return C > 0 and rec.kk > 0 and (best_t << COS_FRAC) >= cfg.cos2_raw * rec.kk


def wins_by_lowest_bit(model, rec) -> bool:
    """Did ``rec``'s key join a center whose t beats an earlier center's by t's lowest bit alone?"""
    t = [center_t(model, rec.k, j, lambda s: 1 << s >> 1) for j in range(rec.centers_before)]
    return t[rec.center] % 2 == 1 and t[rec.center] - 1 in t[:rec.center]


@cocotb.test()
async def eas_matches_golden(dut):
    bench = await Bench.start(dut, LadTileConfig)
    cfg, rng, g = bench.cfg, bench.rng, bench.cfg.group
    q, k, v = sequence(bench)
    runs = [golden_records(cfg, qh, k, v) for qh in (q if g > 1 else q[None])]
    model, recs = runs[0]
    assert all(r.center == rec.center and r.rho == rec.rho for _, hr in runs for r, rec in zip(hr, recs))
    xw, rf = cfg.sfm.x_width, cfg.rho_format
    q_src, k_src = bench.source("q_load", query_load_layout(cfg)), bench.source("k_load", beat_load_layout(cfg))
    start_src = bench.source("start", unsigned(1))
    key_sink = bench.sink("key_out", key_out_layout(cfg))
    lookup_src = bench.source("lookup", lookup_layout(cfg))
    approx_sink = bench.sink("approx", head_scores_shape(cfg))
    sfm = bench.memory("recip_req", unsigned(cfg.sfm.recip_in_width), "recip_resp", recip_resp_layout(cfg),
                       sfm_recip(cfg))
    rho_corners = [rf.max_raw, rf.min_raw, 0, 1, -1, 1 << cfg.rho_frac, -(1 << cfg.rho_frac)]
    extra = bench.params.get("extra_lookups", 4)
    want_recip = []
    extra_count = 0
    lookup_idle = 0
    step_cycles = []   # from start's put to key_out, per step
    for i, rec in enumerate(recs):
        head_recs = [hr[i] for _, hr in runs]
        for h, hr in enumerate(head_recs):
            await load_vector(bench, q_src, hr.q, **({"head": h} if g > 1 else {}))
        await load_vector(bench, k_src, rec.k)
        start_cycle = bench.cycles.now
        start_src.put(0)
        C = rec.centers_before
        await key_sink.wait_for(i + 1, timeout_cycles=20 * (C + 4) * cfg.beats + 2000)
        step_cycles.append(key_sink.log[-1][0] - start_cycle)
        bench.check(f"step {rec.n} key_out", key_sink.received[-1][1],
                    {"center": rec.center, "rho": rec.rho, "new_center": int(rec.new_center),
                     "s_new": head_payload(cfg, [hr.s_new for hr in head_recs])})
        bench.check(f"step {rec.n} centers", int(dut.centers.value), rec.centers_after)
        if rec.new_center:
            want_recip.append(rec.kk)
        # APID's lookups of this step, then extra ones with random centers and extreme rho
        lookups = list(rec.lookups)
        for j in range(len(rec.s_hat)):
            approx_sink.expect(head_payload(cfg, [hr.s_hat[j] for hr in head_recs]), inputs=f"step {rec.n} position {j}")
        if C:
            more = [(rng.randrange(C), rng.choice(rho_corners) if rng.random() < 0.5 else
                     rng.randint(rf.min_raw, rf.max_raw)) for _ in range(extra)]
            # the center of largest |q.c| at an extreme rho: s^ saturates whatever the bench's timing
            big = max(range(C), key=lambda j: abs(rec.qcs[j]))
            more[0] = (big, rf.max_raw if i % 2 else rf.min_raw)
            lookups += more
            extra_count += len(more)
            centers, rhos = torch.tensor([c for c, _ in more]), torch.tensor([r for _, r in more])
            scores = [hm.approx_scores(torch.tensor(hr.qcs, dtype=torch.int64), centers, rhos).tolist()
                      for (hm, _), hr in zip(runs, head_recs)]
            for x, (c, r) in enumerate(more):
                approx_sink.expect(head_payload(cfg, [sc[x] for sc in scores]), inputs=f"step {rec.n} extra center {c} rho {r}")
        first = len(approx_sink.log)
        lookup_src.put(*({"center": c, "rho": r} for c, r in lookups))
        await approx_sink.wait_for(len(approx_sink.expected), timeout_cycles=20 * len(lookups) + 2000)
        cycles = [c for c, _ in approx_sink.log[first:]]
        if cycles:   # cycles the step's approx stream lost against one a cycle
            lookup_idle = max(lookup_idle, cycles[-1] - cycles[0] - (len(cycles) - 1))
    await bench.drain(timeout_cycles=2000, settle=50)
    bench.compare("key_out", key_sink.items[len(recs):], [])
    bench.compare("recip_req", sfm.requests.items, want_recip)
    want_approx = [a for w, _ in approx_sink.expected for a in payload_heads(cfg, w)]
    joins = [r for r in recs if not r.new_center]
    free = [r for r in recs if 0 < r.centers_before < cfg.max_centers]   # a verdict, not a full table

    def rho_shift(r):   # rho = sat(round_shift(dot rc, mf + e - rho_frac)) of a join
        return model.center_recip[r.center][1] + cfg.sfm.mantissa_frac - cfg.rho_frac
    bench.finish(
        vectors=len(recs), steps=len(recs),
        new_centers=sum(r.new_center for r in recs), joins=len(joins),
        full_joins=sum(1 for r in joins if r.centers_before >= cfg.max_centers),
        centers=recs[-1].centers_after, zero_keys=sum(1 for r in recs if r.kk == 0),
        rho_saturated=sum(1 for r in joins if r.rho in (rf.max_raw, rf.min_raw)),
        rho_negative=sum(1 for r in joins if r.rho < 0),
        rho_left_shift=sum(1 for r in joins if rho_shift(r) <= 0),   # rho = sat(dot rc << -shift)
        rho_shift_one=sum(1 for r in joins if rho_shift(r) == 1),     # the smallest right shift
        lookups=len(want_approx), extra_lookups=extra_count,
        nonzero_approx=sum(1 for a in want_approx if a != 0),
        approx_saturated=sum(1 for a in want_approx if a in (cfg.sfm.x_format.max_raw, cfg.sfm.x_format.min_raw)),
        recips=len(want_recip), lookup_idle_cycles=lookup_idle,
        # verdicts t's rounding half decides: with a quarter added (or truncated) the key would not join; with
        # a whole unit added, it would
        joins_by_rounding_up=sum(1 for r in free if not r.new_center and not joins_with_half(model, r, lambda s: 1 << s >> 2)),
        new_centers_by_rounding_down=sum(1 for r in free if r.new_center and joins_with_half(model, r, lambda s: 1 << s)),
        joins_by_lowest_bit=sum(1 for r in joins if wins_by_lowest_bit(model, r)),
        # new centers stored with a nonzero exponent (compact centers that are not their key)
        compact_centers=sum(1 for r in recs if r.new_center and int(compact_center(torch.tensor(r.k), cfg)[1]) > 0),
        step_cycles=step_cycles, step_centers=[[r.centers_before, int(r.new_center)] for r in recs],
        # steps whose new key's score differs between the heads (each head's own query reaches s_n)
        heads_differ=sum(1 for i in range(len(recs)) if len({hr[i].s_new for _, hr in runs}) > 1))
