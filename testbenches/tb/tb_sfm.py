"""cocotb: SFM == golden.sfm (EXP value and interval, RECIP mantissa and exponent) on
random inputs and corner cases, with random input gaps and output back-pressure."""
from __future__ import annotations

import cocotb
import torch

from golden.sfm import SfmConfig, SfmOp, exp2, exp_pwl, recip
from hdl.lib.sfm import sfm_in_layout, sfm_out_layout
from testbenches.streams import Bench


def corner_inputs(cfg: SfmConfig) -> list[tuple[int, int]]:
    xf = cfg.x_format
    xs = [0, -1, 1, xf.max_raw, xf.min_raw, xf.min_raw + 1]
    for e in cfg.exp_boundaries_raw:
        xs += [e - 1, e, e + 1]
    xs = list(dict.fromkeys(min(max(x, xf.min_raw), xf.max_raw) for x in xs))   # a boundary may lie outside x's format
    zmax = (1 << cfg.recip_in_width) - 1
    zs = [0, 1, 2, 3, zmax, zmax - 1] + [1 << k for k in range(cfg.recip_in_width)] \
        + [(1 << k) - 1 for k in range(2, cfg.recip_in_width + 1)]
    x2 = [0, -1, 1, xf.min_raw, xf.max_raw, -(1 << xf.frac), -(64 << xf.frac) if -(64 << xf.frac) >= xf.min_raw else -1]
    return [(SfmOp.EXP, x) for x in xs] + [(SfmOp.RECIP, z) for z in zs] + [(SfmOp.EXP2, x) for x in x2]


def random_inputs(cfg: SfmConfig, rng, n: int) -> list[tuple[int, int]]:
    xf = cfg.x_format
    cutoff_raw = cfg.exp_boundaries_raw[-1]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.25:
            lo = max(xf.min_raw, rng.choice((xf.min_raw, -(20 << xf.frac), -(2 << xf.frac))))
            out.append((SfmOp.EXP2, rng.randint(lo, 0)))
        elif kind < 0.6:
            lo = max(xf.min_raw, rng.choice((xf.min_raw, cutoff_raw - 16, cutoff_raw)))   # within x's format
            hi = rng.choice((0, xf.max_raw))
            out.append((SfmOp.EXP, rng.randint(min(lo, hi), hi)))
        else:
            bits = rng.randint(1, cfg.recip_in_width)
            out.append((SfmOp.RECIP, rng.randint(1 << (bits - 1), (1 << bits) - 1)))
    return out


def expected(cfg: SfmConfig, op: int, v: int) -> dict:
    if op == SfmOp.EXP:
        y, r = exp_pwl(torch.tensor([v]), cfg)
        return {"value": int(y), "interval": int(r), "exponent": 0}
    mant, k = (exp2 if op == SfmOp.EXP2 else recip)(torch.tensor([v]), cfg)
    return {"value": int(mant), "interval": 0, "exponent": int(k)}


@cocotb.test()
async def sfm_matches_golden(dut):
    bench = await Bench.start(dut, SfmConfig)
    cfg, rng = bench.cfg, bench.rng
    src, sink = bench.source("i", sfm_in_layout(cfg)), bench.sink("o", sfm_out_layout(cfg))
    corners = corner_inputs(cfg)
    inputs = corners + random_inputs(cfg, rng, bench.vectors(1000))
    want = [expected(cfg, op, v) for op, v in inputs]
    for (op, v), w in zip(inputs, want):   # the operand the op does not use is random
        src.put({"op": op, "x": v if op != SfmOp.RECIP else rng.randint(-5, 5), "z": v if op == SfmOp.RECIP else rng.randint(0, 9)})
        sink.expect(w, inputs=(op, v))
    await bench.drain(timeout_cycles=20 * len(want) + 1000, settle=10)
    intervals_seen = sorted({w["interval"] for (op, _), w in zip(inputs, want) if op == SfmOp.EXP})
    bench.finish(vectors=len(want), corner_cases=len(corners), nonzero_outputs=sum(1 for w in want if w["value"]),
                 intervals_seen=intervals_seen)
    assert intervals_seen == list(range(cfg.intervals + 1)), f"not every interval exercised: {intervals_seen}"
