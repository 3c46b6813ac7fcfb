"""cocotb: VPU == golden.vpu on random transactions and corner cases, with random
input gaps and output back-pressure: AXPY beats with either ``last`` (each is emitted), AXPY
beats between the beats of a DOT/SQDIST (its accumulator untouched), and the latency (the
fewest cycles from a beat to its result must be ``Vpu.LATENCY``)."""
from __future__ import annotations

import cocotb
import torch

from golden.vpu import VpuConfig, VpuOp, axpy, reduce_beats
from hdl.lib.vpu import Vpu, vpu_in_layout, vpu_out_layout
from testbenches.streams import Bench


def _beat(cfg, op, last, a, b=None, acc=None, scalar=0):
    return {"op": op, "last": int(last), "scalar": scalar, "a": a,
            "b": b if b is not None else [0] * cfg.lanes, "acc": acc if acc is not None else [0] * cfg.lanes}


def _vector(cfg, rng, style, fmt=None):
    """``lanes`` elements of ``fmt`` (default ``in_format``; ``a_format`` for a)."""
    fmt = fmt or cfg.in_format
    lo, hi = fmt.min_raw, fmt.max_raw
    if style == "small":   # within the format: in_width 4 holds -8..7
        return [rng.randint(max(lo, -8), min(hi, 8)) for _ in range(cfg.lanes)]
    if style == "extreme":
        return [rng.choice((lo, hi, 0, -1, 1)) for _ in range(cfg.lanes)]
    return [rng.randint(lo, hi) for _ in range(cfg.lanes)]


def _axpy_case(cfg, scalar, a, acc, last=True):
    """One AXPY beat and its golden output lanes (emitted whatever ``last``)."""
    want = axpy(scalar, torch.tensor(a), torch.tensor(acc), cfg).tolist()
    return [_beat(cfg, VpuOp.AXPY, last, a, acc=acc, scalar=scalar)], {"vec": want}


def _reduce_case(cfg, op, a, b):
    """The beats of a DOT / SQDIST over rows ``a, b`` and its golden sum."""
    want = reduce_beats(op, torch.tensor(a), torch.tensor(b), cfg)
    return [_beat(cfg, op, k == len(a) - 1, a[k], b[k]) for k in range(len(a))], {"dot": want}


def transaction(cfg, rng, op=None, beats=None, style=None):
    """(beats to send, expected output): {'dot': int} or {'vec': list}."""
    op = op if op is not None else rng.choice(sorted(cfg.ops))
    style = style or rng.choice(("uniform", "uniform", "small", "extreme"))
    if op == VpuOp.AXPY:
        a = _vector(cfg, rng, style, cfg.a_format)
        lo, hi = cfg.acc_format.min_raw, cfg.acc_format.max_raw
        acc = [rng.choice((rng.randint(lo, hi), rng.randint(-1000, 1000), lo, hi)) for _ in range(cfg.lanes)]
        scalar = rng.choice((rng.randint(cfg.in_format.min_raw, cfg.in_format.max_raw), cfg.in_format.min_raw,
                             cfg.in_format.max_raw, 0, 1, -1))
        return _axpy_case(cfg, scalar, a, acc, last=rng.random() < 0.5)
    n = beats or rng.randint(1, 8)
    a = [_vector(cfg, rng, style, cfg.a_format) for _ in range(n)]
    b = [_vector(cfg, rng, style) for _ in range(n)]
    return _reduce_case(cfg, op, a, b)


def interleaved(cfg, rng):
    """A DOT / SQDIST with an AXPY beat between two of its beats: (beats, [AXPY's result, the
    reduction's])."""
    red_beats, red_want = transaction(cfg, rng, rng.choice(sorted(cfg.ops - {VpuOp.AXPY})), beats=rng.randint(2, 8))
    ax_beats, ax_want = transaction(cfg, rng, VpuOp.AXPY)
    k = rng.randint(1, len(red_beats) - 1)
    return red_beats[:k] + ax_beats + red_beats[k:], [ax_want, red_want]


def corner_cases(cfg, rng):
    lo, hi = cfg.in_format.min_raw, cfg.in_format.max_raw
    alo, ahi = cfg.a_format.min_raw, cfg.a_format.max_raw   # (a narrower a: its own extremes)
    # enough beats to saturate, where that is at most 2^16 (every preset; a random config's
    # accumulator 23 bits wider than its products took 2^25 beats, a run that never ended: there a
    # long accumulation of extremes instead)
    long = min(1 << 16, 1 + (1 << (cfg.acc_width - cfg.in_width - cfg.a_format.width + 2)) // cfg.lanes)
    cases = [_reduce_case(cfg, op, [[va] * cfg.lanes] * long, [[vb] * cfg.lanes] * long)
             for op, va, vb in ((VpuOp.DOT, alo, lo), (VpuOp.DOT, alo, hi), (VpuOp.SQDIST, alo, hi), (VpuOp.DOT, 0, hi))
             if op in cfg.ops]
    amax, amin = cfg.acc_format.max_raw, cfg.acc_format.min_raw
    for scalar, av, accv in ((hi, ahi, amax), (lo, ahi, amin), (lo, alo, amax), (0, ahi, 0), (1, -1, 0)):
        cases.append(_axpy_case(cfg, scalar, [av] * cfg.lanes, [accv] * cfg.lanes))
    cases.append(transaction(cfg, rng, VpuOp.DOT, beats=1, style="extreme"))
    return cases


@cocotb.test()
async def vpu_matches_golden(dut):
    bench = await Bench.start(dut, VpuConfig)
    cfg, rng = bench.cfg, bench.rng
    src, sink = bench.source("i", vpu_in_layout(cfg)), bench.sink("o", vpu_out_layout(cfg))
    corners = corner_cases(cfg, rng)
    cases = corners + [interleaved(cfg, rng) if rng.random() < 0.1 else transaction(cfg, rng)
                       for _ in range(bench.vectors(1000))]
    cases = [(beats, want if isinstance(want, list) else [want]) for beats, want in cases]
    for n, (beats, wants) in enumerate(cases):
        src.put(*beats)
        for want in wants:
            sink.expect(want, inputs=f"transaction {n}, op {beats[0]['op']}, {len(beats)} beats")
    # a corner case saturating a wide accumulator is thousands of beats: the bound follows the beats sent
    await bench.drain(timeout_cycles=8 * sum(len(beats) for beats, _ in cases) + 40 * len(cases) + 10000)
    # latency: the beats that produce a result (AXPY, a reduction's last), paired with the results in order
    producing = [cyc for cyc, b in src.sent if b["op"] == VpuOp.AXPY or b["last"]]
    latencies = [out - inp for inp, (out, _) in zip(producing, sink.received)]
    bench.check("fewest cycles from a beat to its result", min(latencies), Vpu.LATENCY)
    wants = [w for _, ws in cases for w in ws]
    nonzero = sum(1 for w in wants if (any(w["vec"]) if "vec" in w else w["dot"] != 0))
    bench.finish(vectors=len(wants), corner_cases=len(corners), beats=len(src.sent), nonzero_outputs=nonzero,
                 interleaved=sum(len(ws) > 1 for _, ws in cases),
                 axpy_not_last=sum(1 for _, b in src.sent if b["op"] == VpuOp.AXPY and not b["last"]))
    assert nonzero > len(wants) // 2, "outputs are mostly zero: stimulus is not exercising the VPU"
