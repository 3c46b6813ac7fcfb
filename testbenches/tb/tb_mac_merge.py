"""cocotb: MAC Merge unit == golden.mac_unit.merge_bits on merges and removals: random
states, equal maxima, far-apart maxima (exp underflow), zero-weight states, sum
saturation, cancellation exactly at and around the bound; optionally real states from
SmolLM2. Random gaps on ``i``, back-pressure on ``o``."""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.mac_unit import OP_DOWNDATE, OP_MERGE, MacUnitConfig, merge_bits
from hdl.mac.merge import merge_in_layout, merge_out_layout
from testbenches.streams import Context, StreamSink, StreamSource, start


def random_state(cfg, rng):
    of = cfg.out_format
    m = rng.randint(-(8 << cfg.score_frac), 8 << cfg.score_frac)
    s = rng.choice((rng.randint(1 << cfg.sum_frac, 300 << cfg.sum_frac), rng.randint(1, 1 << cfg.sum_frac)))
    o = [rng.randint(of.min_raw // 8, of.max_raw // 8) for _ in range(cfg.head_dim)]
    return m, s, o


def synthetic_cases(cfg, rng, n):
    cases = []
    smax, sfmt = cfg.sum_format.max_raw, cfg.score_format
    for _ in range(n):
        op = rng.choice((OP_MERGE, OP_DOWNDATE))
        (m1, s1, o1), (m2, s2, o2) = random_state(cfg, rng), random_state(cfg, rng)
        kind = rng.random()
        if kind < 0.15:
            m2 = m1  # equal maxima
        elif kind < 0.2:
            m2 = rng.choice((sfmt.min_raw, sfmt.max_raw))  # far apart: exp underflows to 0
        elif kind < 0.25:
            s2 = 0  # zero-weight state
        elif kind < 0.3:
            s1, s2, op = smax, smax, OP_MERGE  # sum saturates
        elif kind < 0.45:  # removal at the cancellation bound: s*2^cb vs a, equal maxima
            op, m2 = OP_DOWNDATE, m1
            s2 = s1 - (s1 >> cfg.cancel_bits) + rng.randint(-2, 2)
        elif kind < 0.5:
            op, m2, s2 = OP_DOWNDATE, m1, s1  # complete cancellation
        cases.append((op, m1, s1, o1, m2, s2, o2))
    cases.append((OP_MERGE, 0, 0, [0] * cfg.head_dim, 0, 0, [0] * cfg.head_dim))  # two empty states
    return cases


@cocotb.test()
async def merge_matches_golden(dut):
    ctx = Context(MacUnitConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    cycles = await start(dut)
    src = StreamSource(dut, "i", merge_in_layout(cfg), cycles, rng, gap=p.get("gap", 0.3))
    sink = StreamSink(dut, "o", merge_out_layout(cfg), cycles, rng, stall=p.get("stall", 0.3))
    if p.get("trace"):
        cases = [tuple(c) for c in torch.load(p["trace"])["merge_cases"]][:p.get("vectors", 1000)]
    else:
        cases = synthetic_cases(cfg, rng, p.get("vectors", 1000))
        if p.get("only_op"):
            op = OP_MERGE if p["only_op"] == "merge" else OP_DOWNDATE
            cases = [(op,) + tuple(c[1:]) for c in cases]
    want, flagged = [], 0
    lanes = cfg.lanes
    for op, m1, s1, o1, m2, s2, o2 in cases:
        for b in range(cfg.beats):
            src.put({"op": op, "m1": m1, "s1": s1, "m2": m2, "s2": s2,
                     "o1": o1[b * lanes:(b + 1) * lanes], "o2": o2[b * lanes:(b + 1) * lanes]})
        r = merge_bits(op, m1, s1, torch.tensor(o1), m2, s2, torch.tensor(o2), cfg)
        flagged += r.flagged
        for b in range(cfg.beats):
            want.append({"m": r.m, "s": r.s, "flagged": int(r.flagged), "o": r.o[b * lanes:(b + 1) * lanes]})
    start_cycle = cycles.now
    await sink.wait_for(len(want), timeout_cycles=len(want) * 60 + 10000)
    await ClockCycles(dut.clk, 20)
    assert len(sink.received) == len(want)
    mismatches = [f"beat #{n}: rtl {got} golden {w}" for n, ((_, got), w) in enumerate(zip(sink.received, want))
                  if got != w]
    ctx.report.update(vectors=len(cases), beats=len(want), mismatches=len(mismatches), flagged=flagged,
                      cycles=cycles.now - start_cycle,
                      nonzero_outputs=sum(1 for w in want if any(w["o"])),
                      output_cycles=[c for c, _ in sink.received])
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
