"""VPU: ``lanes`` multipliers running DOT, SQDIST (accumulated over beats) and AXPY.

Implements golden/vpu.py bit for bit (see its docstring for the three operations).
Seven pipeline stages that stall together when the output is not taken (latency 7; with
``stall_free`` they never stall: no clock enable, both streams always ready, for a user that
takes every result as it comes, mac-decode's, whose enable net was its slowest routed path):
stage 1 registers the multiplier operands per lane (the multiplier is shared: ``a*b`` for
DOT, ``(a-b)**2`` for SQDIST, ``scalar*a`` for AXPY; a narrower ``a``, ``a_width`` bits, is the
second factor in each); stages 2-4 register them once more, the product, and the product once
more (a MULT18X18D per lane with its own input and output registers, synth/absorb.py; for
operands over 17 bits, AC's and mac-decode's, the product's pieces, a MULT18X18D each, and their
sum: two a lane where ``a`` fits 18 bits); stages 5 and 6 register the beat's balanced adder tree
(pair sums, then the rest) and the rounded AXPY products, then those plus ``acc``; stage 7 adds
the beat into the saturating accumulator (DOT/SQDIST, emitted on the ``last`` beat) or forms
the saturated AXPY lanes (every beat).
"""
from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.vpu import PIPELINE_LATENCY, VpuConfig, VpuOp

from .arith import round_shift, saturate, saturating_add, set_ready, stall_all_enable
from .pipe import CHUNK, csa_sum, partial_products, placed, register_partials, tree_sum


def vpu_in_layout(cfg: VpuConfig) -> data.StructLayout:
    return data.StructLayout({
        "op": VpuOp,
        "last": unsigned(1),
        "scalar": signed(cfg.in_width),
        "a": data.ArrayLayout(signed(cfg.a_format.width), cfg.lanes),
        "b": data.ArrayLayout(signed(cfg.in_width), cfg.lanes),
        "acc": data.ArrayLayout(signed(cfg.acc_width), cfg.lanes),
    })


def vpu_out_layout(cfg: VpuConfig) -> data.StructLayout:
    return data.StructLayout({
        "dot": signed(cfg.acc_width),
        "vec": data.ArrayLayout(signed(cfg.acc_width), cfg.lanes),
    })


def _delayed(m, ce, name: str, *values):
    """Each value (a Signal or a list of them) one register later (loaded when ``ce``)."""
    out = []
    for n, v in enumerate(values):
        if isinstance(v, list):
            out.append(_delayed(m, ce, f"{name}{n}_", *v))
            continue
        reg = Signal.like(v, name=f"{name}_{n}")
        with m.If(ce):
            m.d.sync += reg.eq(v)
        out.append(reg)
    return out


class Vpu(wiring.Component):
    """Vector unit. ``i``: one beat per transfer; ``o``: a reduction result on the
    last beat of DOT/SQDIST, one lane vector per AXPY beat (whatever its ``last``; an AXPY
    between the beats of a DOT/SQDIST leaves that reduction's accumulator alone)."""

    LATENCY = PIPELINE_LATENCY   # cycles from a beat's transfer on ``i`` to its result on ``o`` when nothing stalls

    def __init__(self, cfg: VpuConfig, ops=None):
        """``ops``: the operations its user issues (by default all that ``cfg`` runs, ``cfg.ops``);
        the others' datapaths are not built (a DOT-only VPU has no AXPY lanes: ``o.vec`` stays 0),
        for a smaller netlist and faster Verilog generation; an op outside ``ops`` on ``i`` gives
        no defined result."""
        self.cfg = cfg
        self.ops = cfg.ops if ops is None else frozenset(ops)
        if not self.ops or not self.ops <= cfg.ops:
            self._MustUse__silence = True   # (never built: no "unused elaboratable" warning)
            raise ValueError(f"Vpu ops must be a non-empty set of VpuOp within {sorted(o.name for o in cfg.ops)} "
                             f"(SQDIST needs a_width = in_width), got {ops!r}")
        super().__init__({
            "i": In(stream.Signature(vpu_in_layout(cfg), always_ready=cfg.stall_free)),
            "o": Out(stream.Signature(vpu_out_layout(cfg), always_ready=cfg.stall_free)),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        w = cfg.in_width
        ce = stall_all_enable(self.o)
        set_ready(m, self.i, ce)

        # Stage 1: the multiplier operands per lane (a, b for DOT; a-b twice for SQDIST;
        # scalar, a for AXPY), so the multiplier has registers on both sides.
        s0_valid, s0_op, s0_last = Signal(), Signal(VpuOp), Signal()
        # a narrower a is the second factor, s0_y, in every op (there is no SQDIST, whose a - b
        # takes w + 1 bits in both)
        narrow = cfg.a_format.width < w
        s0_x = [Signal(signed(w + 1), name=f"s0_x{l}") for l in range(cfg.lanes)]
        s0_y = [Signal(signed(cfg.a_format.width if narrow else w + 1), name=f"s0_y{l}") for l in range(cfg.lanes)]
        s0_acc = [Signal(signed(cfg.acc_width), name=f"s0_acc{l}") for l in range(cfg.lanes)]
        p = self.i.payload
        axpy = VpuOp.AXPY in self.ops
        axpy_lanes = range(cfg.lanes if axpy else 0)   # (no AXPY lanes in a VPU without AXPY)
        with m.If(ce):
            m.d.sync += [s0_valid.eq(self.i.valid), s0_op.eq(p.op), s0_last.eq(p.last)]
            for l in range(cfg.lanes):
                operands = {}
                if VpuOp.DOT in self.ops:
                    operands[VpuOp.DOT] = (p.b[l], p.a[l]) if narrow else (p.a[l], p.b[l])
                if VpuOp.SQDIST in self.ops:
                    diff = Signal(signed(w + 1), name=f"diff{l}")
                    m.d.comb += diff.eq(p.a[l] - p.b[l])
                    operands[VpuOp.SQDIST] = (diff, diff)
                if axpy:
                    operands[VpuOp.AXPY] = (p.scalar, p.a[l])
                    m.d.sync += s0_acc[l].eq(p.acc[l])
                *cases, last = operands.items()
                with m.Switch(p.op):
                    for op, (x, y) in cases:
                        with m.Case(op):
                            m.d.sync += [s0_x[l].eq(x), s0_y[l].eq(y)]
                    with m.Default():
                        m.d.sync += [s0_x[l].eq(last[1][0]), s0_y[l].eq(last[1][1])]

        # Stages 2-4: the operands registered once more, the product, and the product registered once
        # more: one MULT18X18D per lane (in_width <= 17) whose input and output registers
        # synth/absorb.py moves into the DSP, so only routing is left on either side of it.
        s0_valid, s0_op, s0_last = _delayed(m, ce, "s0b", s0_valid, s0_op, s0_last)
        if axpy:
            s0_acc, = _delayed(m, ce, "s0b_acc", s0_acc)
        s0_x = _delayed(m, ce, "s0b_x", *s0_x)
        s0_y = _delayed(m, ce, "s0b_y", *s0_y)
        s1_valid, s1_op, s1_last = Signal(), Signal(VpuOp), Signal()
        # a product's signed bits: |a b| <= 2^(2w - 2) (DOT, AXPY), (a - b)^2 <= (2^w - 1)^2 < 2^(2w) (SQDIST)
        pw = 2 * w + 1
        s1_prod = [Signal(signed(pw), name=f"s1_prod{l}") for l in range(cfg.lanes)]
        s1_acc = [Signal(signed(cfg.acc_width), name=f"s1_acc{l}") for l in range(cfg.lanes)]
        with m.If(ce):
            m.d.sync += [s1_valid.eq(s0_valid), s1_op.eq(s0_op), s1_last.eq(s0_last)]
            if axpy:
                m.d.sync += [s1_acc[l].eq(s0_acc[l]) for l in range(cfg.lanes)]
        if w + 1 <= CHUNK + 1:   # one MULT18X18D a lane (a narrower a: the same)
            with m.If(ce):
                m.d.sync += [s1_prod[l].eq(s0_x[l] * s0_y[l]) for l in range(cfg.lanes)]
            s1_prod = _delayed(m, ce, "s1b_prod", *s1_prod)
        else:   # wider (AC's): the product's pieces (one MULT18X18D each) registered in the fabric, then
            # their sum (one carry chain after a carry-save reduction) registered (the sum had run from
            # the DSPs' output pins to s1_prod: AC's 88.2 MHz at ecp5-85f)
            pieces = [register_partials(m, ce, partial_products(s0_x[l], s0_y[l]), f"s1_prod{l}")
                      for l in range(cfg.lanes)]
            sums = [csa_sum(m, placed(pieces[l]), pw, f"s1_prod{l}").as_signed() for l in range(cfg.lanes)]
            with m.If(ce):
                m.d.sync += [s1_prod[l].eq(sums[l]) for l in range(cfg.lanes)]
        s1_valid, s1_op, s1_last = _delayed(m, ce, "s1b", s1_valid, s1_op, s1_last)
        if axpy:
            s1_acc, = _delayed(m, ce, "s1b_acc", s1_acc)

        # Stage 5: the first level of the beat's adder tree (pair sums); the AXPY products rounded.
        npairs = (cfg.lanes + 1) // 2
        s2_valid, s2_op, s2_last = Signal(), Signal(VpuOp), Signal()
        s2_pairs = [Signal(signed(pw + 1), name=f"s2_pair{n}") for n in range(npairs)]
        s2_round = [Signal(signed(pw + 1), name=f"s2_round{l}") for l in range(cfg.lanes)]
        s2_acc = [Signal(signed(cfg.acc_width), name=f"s2_acc{l}") for l in range(cfg.lanes)]
        with m.If(ce):
            m.d.sync += [s2_valid.eq(s1_valid), s2_op.eq(s1_op), s2_last.eq(s1_last)]
            m.d.sync += [s2_pairs[n].eq(tree_sum(s1_prod[2 * n:2 * n + 2])) for n in range(npairs)]
            for l in axpy_lanes:
                m.d.sync += [s2_round[l].eq(round_shift(s1_prod[l], cfg.axpy_shift)), s2_acc[l].eq(s1_acc[l])]

        # Stage 6: the rest of the adder tree; the rounded AXPY products added to acc.
        s3_valid, s3_op, s3_last = Signal(), Signal(VpuOp), Signal()
        s3_beat_sum = Signal(signed(pw + cfg.lanes.bit_length()))
        s3_lanes = [Signal(signed(cfg.acc_width + 1), name=f"s3_lane{l}") for l in range(cfg.lanes)]
        with m.If(ce):
            m.d.sync += [s3_valid.eq(s2_valid), s3_op.eq(s2_op), s3_last.eq(s2_last),
                         s3_beat_sum.eq(tree_sum(s2_pairs))]
            m.d.sync += [s3_lanes[l].eq(s2_round[l] + s2_acc[l]) for l in axpy_lanes]
        s2_valid, s2_op, s2_last, s2_beat_sum, s2_lanes = s3_valid, s3_op, s3_last, s3_beat_sum, s3_lanes

        # Stage 7: accumulate with saturation, or saturate the AXPY lanes. A reduction's first
        # beat adds to 0 (``fresh``: the last beat was a reduction's last), so acc needs no clear
        # after the add: the loop is the add and its range check only.
        acc, fresh = Signal(signed(cfg.acc_width)), Signal(init=1)
        acc_next = Signal(signed(cfg.acc_width))
        m.d.comb += acc_next.eq(saturating_add(Mux(fresh, 0, acc), s2_beat_sum, signed(cfg.acc_width)))
        with m.If(ce):
            s2_axpy = (s2_op == VpuOp.AXPY) if axpy else Const(0)
            m.d.sync += self.o.valid.eq(s2_valid & (s2_axpy | s2_last))
            with m.If(s2_valid & ~s2_axpy):
                m.d.sync += [self.o.payload.dot.eq(acc_next), acc.eq(acc_next), fresh.eq(s2_last)]
            for l in axpy_lanes:
                m.d.sync += self.o.payload.vec[l].eq(saturate(s2_lanes[l], signed(cfg.acc_width)))
        return m
