"""cocotb: LAD EAS (hdl/lad/eas.py) alone == golden.lad_tile.LadTileModel's EAS (docs/algorithms.md §1.4:
center update of k_n, rho, s_n; s^_i = rho_i q.c_j(i) / sqrt(d)), bit-exact.

The bench plays the tile sequencer and the SFM: per golden step it sets q, k_n, sends
``start``, serves RECIP of a new center's |k|^2 (``recip_req``/``recip_resp``, golden.sfm.recip,
random latency), checks ``key_out`` (center, rho, new_center, s_n) and ``centers``, then sends
APID's lookups of the step (every absorbed position's center and rho) plus random extra
lookups with extreme rho, checking each ``approx`` against ``LadTileModel.approx_scores``.
Random gaps on start/lookup/recip_resp, random back-pressure on key_out/approx/recip_req.
"""
from __future__ import annotations

import cocotb
import torch
from amaranth import signed, unsigned
from cocotb.triggers import ClockCycles

from golden.sfm import recip
from hdl.lad.common import vector_layout
from hdl.lad.eas import key_out_layout, lookup_layout, recip_resp_layout
from testbenches.streams import StreamMemory, StreamSink, StreamSource, pack
from testbenches.tb.lad_steps import open_bench


@cocotb.test()
async def eas_matches_golden(dut):
    ctx, (q, k, v), model, recs, cycles, (gap, stall) = await open_bench(dut)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    xw, rf = cfg.sfm.x_width, cfg.rho_format
    start_src = StreamSource(dut, "start", unsigned(1), cycles, rng, gap=gap)
    key_sink = StreamSink(dut, "key_out", key_out_layout(cfg), cycles, rng, stall=stall)
    lookup_src = StreamSource(dut, "lookup", lookup_layout(cfg), cycles, rng, gap=gap)
    approx_sink = StreamSink(dut, "approx", signed(xw), cycles, rng, stall=stall)

    def sfm_recip(z):
        m_, e_ = (int(t) for t in recip(torch.tensor([z]), cfg.sfm))
        return {"mantissa": m_, "exponent": e_}

    sfm = StreamMemory(dut, "recip_req", unsigned(cfg.sfm.recip_in_width), "recip_resp", recip_resp_layout(cfg),
                       cycles, rng, sfm_recip, latency=tuple(p.get("latency", (1, 8))), stall=stall, gap=gap)
    rho_corners = [rf.max_raw, rf.min_raw, 0, 1, -1, 1 << cfg.rho_frac, -(1 << cfg.rho_frac)]
    extra = p.get("extra_lookups", 4)
    mismatches, want_approx, want_recip = [], [], []
    extra_count = 0
    for i, rec in enumerate(recs):
        n = rec["n"]
        dut.q.value = pack(vector_layout(cfg), rec["q"])
        dut.k.value = pack(vector_layout(cfg), rec["k"])
        start_src.put(0)
        C = rec["centers_before"]
        await key_sink.wait_for(i + 1, timeout_cycles=20 * (C + 4) * cfg.beats + 2000)
        got = key_sink.received[-1][1]
        want = {key: rec[key] for key in ("center", "rho", "new_center", "s_new")}
        if got != want:
            mismatches.append(f"step {n} key_out: rtl {got} golden {want}")
        if int(dut.centers.value) != rec["centers_after"]:
            mismatches.append(f"step {n} centers: rtl {int(dut.centers.value)} golden {rec['centers_after']}")
        if rec["new_center"]:
            want_recip.append(rec["kk"])
        # APID's lookups of this step, then extra ones with random centers and extreme rho
        lookups = [tuple(x) for x in rec["lookups"]]
        want_approx += rec["s_hat"]
        if C:
            more = [(rng.randrange(C), rng.choice(rho_corners) if rng.random() < 0.5 else
                     rng.randint(rf.min_raw, rf.max_raw)) for _ in range(extra)]
            lookups += more
            extra_count += len(more)
            qcs = torch.tensor(rec["qcs"], dtype=torch.int64)
            want_approx += model.approx_scores(qcs, torch.tensor([c for c, _ in more]),
                                               torch.tensor([r for _, r in more])).tolist()
        for c, r in lookups:
            lookup_src.put({"center": c, "rho": r})
        await approx_sink.wait_for(len(want_approx), timeout_cycles=20 * len(lookups) + 2000)
    await ClockCycles(dut.clk, 50)
    got_approx = [a for _, a in approx_sink.received]
    bad = [f"lookup #{j}: rtl {g} golden {w}" for j, (g, w) in enumerate(zip(got_approx, want_approx)) if g != w]
    mismatches += bad
    if len(got_approx) != len(want_approx) or len(key_sink.received) != len(recs):
        mismatches.append(f"counts: approx {len(got_approx)}/{len(want_approx)}, "
                          f"key_out {len(key_sink.received)}/{len(recs)}")
    got_recip = [z for _, z in sfm.requests.received]
    if got_recip != want_recip:
        mismatches.append(f"recip_req: rtl {got_recip} golden {want_recip}")
    joins = [r for r in recs if not r["new_center"]]
    ctx.report.update(
        steps=len(recs), vectors=len(recs), mismatches=len(mismatches), mismatch_list=mismatches[:20],
        new_centers=sum(r["new_center"] for r in recs), joins=len(joins),
        full_joins=sum(1 for r in joins if r["centers_before"] >= cfg.max_centers),
        centers=recs[-1]["centers_after"], zero_keys=sum(1 for r in recs if r["kk"] == 0),
        rho_saturated=sum(1 for r in joins if r["rho"] in (rf.max_raw, rf.min_raw)),
        rho_negative=sum(1 for r in joins if r["rho"] < 0),
        lookups=len(want_approx), extra_lookups=extra_count,
        nonzero_approx=sum(1 for a in want_approx if a != 0),
        approx_saturated=sum(1 for a in want_approx if a in (cfg.sfm.x_format.max_raw, cfg.sfm.x_format.min_raw)),
        recips=len(want_recip), cycles=cycles.now)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
