"""The RTL's round_shift and saturate (hdl/lib/arith.py) equal golden.fixedpoint's on every
input of small widths, under Amaranth's simulator: the one-definition rule, checked."""
import pytest
from amaranth import Module, Shape, Signal
from amaranth.sim import Simulator

from golden.fixedpoint import FixedFormat, round_shift as golden_round_shift, saturate as golden_saturate
from hdl.lib.arith import round_shift, saturate

SAT_CASES = [(7, True, 4, True), (7, True, 4, False), (6, False, 4, True), (6, False, 4, False),
             (4, True, 6, True), (3, False, 5, True), (5, True, 5, False), (5, False, 5, True),
             (4, True, 4, True), (3, True, 6, False), (4, False, 6, False)]


def _all(width, signed):
    return range(-(1 << (width - 1)), 1 << (width - 1)) if signed else range(1 << width)


@pytest.mark.parametrize("vw, vs, tw, ts", SAT_CASES)
def test_saturate_matches_golden_exhaustively(vw, vs, tw, ts):
    m = Module()
    v, o = Signal(Shape(vw, vs)), Signal(Shape(tw, ts))
    m.d.comb += o.eq(saturate(v, Shape(tw, ts)))
    bad = []

    async def bench(ctx):
        for x in _all(vw, vs):
            ctx.set(v, x)
            if ctx.get(o) != golden_saturate(x, FixedFormat(tw, 0, ts)):
                bad.append((x, ctx.get(o)))
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not bad


@pytest.mark.parametrize("shift", [0, 1, 3, "variable"])
def test_round_shift_matches_golden_exhaustively(shift):
    m = Module()
    v, amount, o = Signal(Shape(8, True)), Signal(3), Signal(Shape(9, True))
    m.d.comb += o.eq(round_shift(v, amount if shift == "variable" else shift))
    bad = []

    async def bench(ctx):
        for s in (range(8) if shift == "variable" else [shift]):
            ctx.set(amount, s)
            for x in _all(8, True):
                ctx.set(v, x)
                if ctx.get(o) != golden_round_shift(x, s):
                    bad.append((s, x, ctx.get(o)))
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not bad
