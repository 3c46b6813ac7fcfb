"""cocotb: VPU == golden.vpu on random transactions and corner cases, with random
input gaps and output back-pressure."""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.vpu import OP_AXPY, OP_DOT, OP_SQDIST, VpuConfig, axpy, reduce_beats
from hdl.lib.vpu import vpu_in_layout, vpu_out_layout
from testbenches.streams import Context, StreamSink, StreamSource, start


def _beat(cfg, op, last, a, b=None, acc=None, scalar=0):
    return {"op": op, "last": int(last), "scalar": scalar, "a": a,
            "b": b if b is not None else [0] * cfg.lanes, "acc": acc if acc is not None else [0] * cfg.lanes}


def _vector(cfg, rng, style):
    lo, hi = cfg.in_format.min_raw, cfg.in_format.max_raw
    if style == "small":
        return [rng.randint(-8, 8) for _ in range(cfg.lanes)]
    if style == "extreme":
        return [rng.choice((lo, hi, 0, -1, 1)) for _ in range(cfg.lanes)]
    return [rng.randint(lo, hi) for _ in range(cfg.lanes)]


def transaction(cfg, rng, op=None, beats=None, style=None):
    """(beats to send, expected outputs): each expected is ('dot', int) or ('vec', list)."""
    op = op if op is not None else rng.choice((OP_DOT, OP_SQDIST, OP_AXPY))
    style = style or rng.choice(("uniform", "uniform", "small", "extreme"))
    if op == OP_AXPY:
        a = _vector(cfg, rng, style)
        lo, hi = cfg.acc_format.min_raw, cfg.acc_format.max_raw
        acc = [rng.choice((rng.randint(lo, hi), rng.randint(-1000, 1000), lo, hi)) for _ in range(cfg.lanes)]
        scalar = rng.choice((rng.randint(cfg.in_format.min_raw, cfg.in_format.max_raw), cfg.in_format.min_raw,
                             cfg.in_format.max_raw, 0, 1, -1))
        want = axpy(scalar, torch.tensor(a), torch.tensor(acc), cfg).tolist()
        return [_beat(cfg, op, True, a, acc=acc, scalar=scalar)], [("vec", want)]
    n = beats or rng.randint(1, 8)
    a = [_vector(cfg, rng, style) for _ in range(n)]
    b = [_vector(cfg, rng, style) for _ in range(n)]
    want = reduce_beats(op, torch.tensor(a), torch.tensor(b), cfg)
    return [_beat(cfg, op, k == n - 1, a[k], b[k]) for k in range(n)], [("dot", want)]


def corner_cases(cfg, rng):
    lo, hi = cfg.in_format.min_raw, cfg.in_format.max_raw
    cases = []
    long = 1 + (1 << (cfg.acc_width - 2 * cfg.in_width + 2)) // cfg.lanes  # enough beats to saturate
    for op, va, vb in ((OP_DOT, lo, lo), (OP_DOT, lo, hi), (OP_SQDIST, lo, hi), (OP_DOT, 0, hi)):
        a, b = [[va] * cfg.lanes] * long, [[vb] * cfg.lanes] * long
        want = reduce_beats(op, torch.tensor(a), torch.tensor(b), cfg)
        cases.append(([_beat(cfg, op, k == long - 1, a[k], b[k]) for k in range(long)], [("dot", want)]))
    amax, amin = cfg.acc_format.max_raw, cfg.acc_format.min_raw
    for scalar, av, accv in ((hi, hi, amax), (lo, hi, amin), (lo, lo, amax), (0, hi, 0), (1, -1, 0)):
        a, acc = [av] * cfg.lanes, [accv] * cfg.lanes
        want = axpy(scalar, torch.tensor(a), torch.tensor(acc), cfg).tolist()
        cases.append(([_beat(cfg, OP_AXPY, True, a, acc=acc, scalar=scalar)], [("vec", want)]))
    cases.append(transaction(cfg, rng, OP_DOT, beats=1, style="extreme"))
    return cases


@cocotb.test()
async def vpu_matches_golden(dut):
    ctx = Context(VpuConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    cycles = await start(dut)
    src = StreamSource(dut, "i", vpu_in_layout(cfg), cycles, rng, gap=p.get("gap", 0.3))
    sink = StreamSink(dut, "o", vpu_out_layout(cfg), cycles, rng, stall=p.get("stall", 0.3))
    cases = corner_cases(cfg, rng) + [transaction(cfg, rng) for _ in range(p.get("vectors", 1000))]
    expected = []
    for beats, outs in cases:
        for beat in beats:
            src.put(beat)
        expected.extend(outs)
    start_cycle = cycles.now
    await sink.wait_for(len(expected), timeout_cycles=40 * len(expected) + 10000)
    await ClockCycles(dut.clk, 20)
    assert len(sink.received) == len(expected), f"{len(sink.received)} outputs for {len(expected)} expected"
    mismatches = []
    for n, ((_, got), (kind, want)) in enumerate(zip(sink.received, expected)):
        if got[kind] != want:
            mismatches.append(f"#{n} {kind}: rtl {got[kind]} golden {want}")
    nonzero = sum(1 for kind, want in expected if (want != 0 if kind == "dot" else any(want)))
    ctx.report.update(vectors=len(expected), corner_cases=len(corner_cases(cfg, rng)),
                      beats=len(src.sent), cycles=cycles.now - start_cycle,
                      mismatches=len(mismatches), nonzero_outputs=nonzero)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:5]}"
    assert nonzero > len(expected) // 2, "outputs are mostly zero: stimulus is not exercising the VPU"
