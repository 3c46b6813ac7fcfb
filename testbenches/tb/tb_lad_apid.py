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
from cocotb.triggers import ClockCycles

from hdl.lad.apid import absorb_layout, scan_layout
from hdl.lad.common import candidate_layout
from hdl.lad.eas import lookup_layout
from testbenches.streams import StreamMemory, StreamSink, StreamSource, wait_until
from testbenches.tb.lad_steps import open_bench


@cocotb.test()
async def apid_matches_golden(dut):
    ctx, (q, k, v), _, recs, cycles, (gap, stall) = await open_bench(dut)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    xf, nb = cfg.sfm.x_format, cfg.beats
    approx_queue: list[int] = []
    verdicts: dict[int, dict] = {}

    def eas_lookup(_req):   # in order: the golden s^ of the next position
        return approx_queue.pop(0) if approx_queue else 0

    def md_verdict(c):
        return verdicts.get(c["position"], c)

    scan_src = StreamSource(dut, "scan", scan_layout(cfg), cycles, rng, gap=gap)
    eas = StreamMemory(dut, "lookup", lookup_layout(cfg), "approx", signed(xf.width), cycles, rng, eas_lookup,
                       latency=(1, 4), stall=stall, gap=gap)
    smax_sink = StreamSink(dut, "smax", signed(xf.width), cycles, rng, stall=stall)
    md = StreamMemory(dut, "cand", candidate_layout(cfg), "verdict", candidate_layout(cfg), cycles, rng, md_verdict,
                      latency=(nb, 4 * nb), stall=stall, gap=gap)
    done_sink = StreamSink(dut, "done", unsigned(cfg.position_width), cycles, rng, stall=stall)
    absorb_src = StreamSource(dut, "absorb", absorb_layout(cfg), cycles, rng, gap=gap)

    mismatches = []
    want_lookups, want_cands = [], []
    passes = 0
    halved_at: dict[int, int] = {}   # position -> step of a quiet-bump halving
    halved_seen = changed_seen = 0
    for rec in recs:
        n = rec["n"]
        if n:
            passes += 1
            approx_queue[:] = rec["s_hat"]
            want_lookups += [{"center": c, "rho": r} for c, r in rec["lookups"]]
            scan_src.put({"length": n, "m": rng.randint(xf.min_raw, xf.max_raw), "classify": 0})
            await smax_sink.wait_for(passes, timeout_cycles=30 * n + 2000)
            got, want = smax_sink.received[-1][1], max(rec["s_hat"])
            if got != want:
                mismatches.append(f"step {n} smax: rtl {got} golden {want}")
            md_out = rec["md"]
            verdicts.clear()
            for j, pos in enumerate(rec["cand"]):
                verdicts[pos] = {"position": pos, "mode": md_out["mode"][j], "counters": md_out["counters"][j]}
                want_cands.append({"position": pos, "mode": rec["cand_mode"][j], "counters": rec["cand_counters"][j]})
                if pos in halved_at:
                    halved_seen += 1
                if rec["cand_mode"][j] != recs[pos]["r_new"]:   # recs[i] is position i
                    changed_seen += 1
            scan_src.put({"length": n, "m": rec["m"], "classify": 1})
            await done_sink.wait_for(passes, timeout_cycles=(30 + 12 * nb) * n + 2000)
            got = done_sink.received[-1][1]
            if got != len(rec["cand"]):
                mismatches.append(f"step {n} done: rtl {got} golden {len(rec['cand'])}")
            for pos, mode, c in zip(rec["quiet"], rec["quiet_mode"], rec["quiet_counters"]):
                if c[mode] + 1 > cfg.counter_max:
                    halved_at.setdefault(pos, n)
        absorb_src.put({"position": n, "center": rec["center"], "rho": rec["rho"], "mode": rec["r_new"]})
        await wait_until(cycles, lambda: len(absorb_src.sent) == n + 1, 2000, "absorb accepted")
    await ClockCycles(dut.clk, 50)
    got_lookups = [c for _, c in eas.requests.received]
    got_cands = [c for _, c in md.requests.received]
    for what, got, want in (("lookup", got_lookups, want_lookups), ("cand", got_cands, want_cands)):
        mismatches += [f"{what} #{j}: rtl {g} golden {w}" for j, (g, w) in enumerate(zip(got, want)) if g != w]
        if len(got) != len(want):
            mismatches.append(f"{what} count: rtl {len(got)} golden {len(want)}")
    if len(smax_sink.received) != passes or len(done_sink.received) != passes:
        mismatches.append(f"smax/done count: {len(smax_sink.received)}/{len(done_sink.received)} of {passes}")
    positions = sum(r["n"] for r in recs)
    ctx.report.update(
        steps=len(recs), vectors=len(recs), mismatches=len(mismatches), mismatch_list=mismatches[:20],
        last_position=recs[-1]["n"], positions=positions, candidates=len(want_cands),
        quiet=positions - len(want_cands), lookups=len(want_lookups),
        all_candidate_steps=sum(1 for r in recs if r["n"] and len(r["cand"]) == r["n"]),
        no_candidate_steps=sum(1 for r in recs if r["n"] and not r["cand"]),
        quiet_halvings=len(halved_at), halved_seen=halved_seen, changed_mode_seen=changed_seen,
        max_counter_seen=max((max(c["counters"]) for c in want_cands), default=0),
        nonzero_smax=sum(1 for _, s in smax_sink.received if s != 0), cycles=cycles.now)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
