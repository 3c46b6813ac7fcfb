"""cocotb: SFM == golden.sfm (EXP value and interval, RECIP mantissa and exponent) on
random inputs and corner cases, with random input gaps and output back-pressure."""
from __future__ import annotations

import cocotb
import torch

from golden.fixedpoint import rounding_half
from golden.sfm import SfmConfig, SfmOp, exp2, exp_interval, exp_pwl, recip
from hdl.lib.sfm import exp2_clamp, sfm_in_layout, sfm_out_layout
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
    x2 += [-exp2_clamp(cfg) + d for d in (-1, 0, 1) if -exp2_clamp(cfg) + d >= xf.min_raw]   # EXP2's clamp of |x|
    out = ([(SfmOp.EXP, x) for x in xs] + [(SfmOp.RECIP, z) for z in zs] + [(SfmOp.EXP2, x) for x in x2]
           + rounding_corners(cfg))
    return out if cfg.with_exp else [(op, v) for op, v in out if op != SfmOp.EXP]   # no EXP built


ENUMERATE_MAX = 1 << 20   # inputs a rounding search looks at (every one, up to this many)


def _span(lo: int, hi: int) -> torch.Tensor:
    """``lo..hi`` inclusive, every value, or an even spread of ENUMERATE_MAX of them."""
    step = max(1, -(-(hi - lo + 1) // ENUMERATE_MAX))
    return torch.arange(lo, hi + 1, step, dtype=torch.int64)


def rounding_corners(cfg: SfmConfig) -> list[tuple[int, int]]:
    """Inputs at the rounding steps, found by searching the input space: EXP's ``a x + bias``
    and EXP2's ``|x| log2e + half`` closest below a step of their shifts (a sum off by one
    changes the output only there), and the table lines' ties, ``c1 * offset`` at ``2^(k-1)``
    and one below modulo ``2^k`` (RECIP over every index and offset, EXP2 over the ``u`` its x
    reach): the only inputs where the rounding constant of ``c0 - round_shift(c1 * offset, k)``
    shows."""
    xf, k = cfg.x_format, cfg.table_offset_shift
    tie = (1 << (k - 1)) if k > 0 else 0
    out = []
    # EXP: per interval, the x whose sum is furthest into its step, and the one at a step
    x = _span(xf.min_raw, xf.max_raw)
    r = exp_interval(x, cfg)
    slope, icpt = torch.tensor(cfg.exp_slopes_raw)[r], torch.tensor(cfg.exp_intercepts_raw)[r]
    half = rounding_half(cfg.exp_shift)
    res = (slope * x + (icpt << cfg.x_frac) + half) % (1 << max(cfg.exp_shift, 0))
    for n in range(cfg.intervals + 1):
        here = r == n
        if here.any():
            out += [(SfmOp.EXP, int(x[here][res[here].argmax()])), (SfmOp.EXP, int(x[here][res[here].argmin()]))]
    # EXP2: |x| up to the clamp (beyond it every |x| gives the same result)
    x = _span(max(xf.min_raw, -exp2_clamp(cfg)), 0)
    half2 = rounding_half(cfg.exp2_shift)
    big = -x * cfg.log2e_raw + half2
    u = big >> cfg.exp2_shift if cfg.exp2_shift >= 0 else big << -cfg.exp2_shift
    res = big % (1 << max(cfg.exp2_shift, 0))
    out += [(SfmOp.EXP2, int(x[res.argmax()])), (SfmOp.EXP2, int(x[res.argmin()]))]
    j = (u >> cfg.table_delta_bits) & ((1 << cfg.table_index_bits) - 1)
    p = torch.tensor(cfg.exp2_c1_raw)[j] * (u & ((1 << cfg.table_delta_bits) - 1)) % (1 << k)
    out += [(SfmOp.EXP2, int(v)) for v in x[(p == tie) | (p == tie - 1)][:4]]
    # RECIP: z with its top bit set, every (index, offset) the input's bits can hold
    w, ib, db = cfg.recip_in_width, cfg.table_index_bits, cfg.table_delta_bits
    low = w - 1 - ib - db
    step = 1 << max(0, -low)                     # offsets below the input's last bit are 0
    step *= max(1, -(-(len(cfg.recip_c1_raw) << db) // (ENUMERATE_MAX * step)))   # (or a spread of them)
    c1 = torch.tensor(cfg.recip_c1_raw)[:, None]
    offset = torch.arange(0, 1 << db, step)[None, :]
    p = (c1 * offset) % (1 << k)
    jj, oo = torch.nonzero((p == tie) | (p == tie - 1), as_tuple=True)
    for jv, ov in list(zip(jj.tolist(), (offset[0][oo]).tolist()))[:4]:
        rest = ov << low if low >= 0 else ov >> -low
        out.append((SfmOp.RECIP, (1 << (w - 1)) | (jv << (w - 1 - ib)) | rest))
    return list(dict.fromkeys(out))


def random_inputs(cfg: SfmConfig, rng, n: int) -> list[tuple[int, int]]:
    xf = cfg.x_format
    cutoff_raw = cfg.exp_boundaries_raw[-1]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.25 or (kind < 0.6 and not cfg.with_exp):   # (no EXP built: EXP2 in its place)
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
    assert intervals_seen == (list(range(cfg.intervals + 1)) if cfg.with_exp else []), \
        f"not every interval exercised: {intervals_seen}"
