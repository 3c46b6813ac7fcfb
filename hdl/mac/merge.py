"""Merge unit: online-softmax merge (⊕) and removal (⊖) of two attention states.

Implements golden.mac_unit.merge_bits bit for bit (docs/algorithms.md §2: the "⊕" that joins
prefix, band and tail, and the "⊖" downdate that stores cache entries without the last
S keys). A transaction is ``head_dim/lanes`` beats on ``i``; the scalars (op, m1, s1, m2,
s2) are read from its first beat while it waits. Scalar phase, one SFM shared in turn:
EXP2 of ``-|m1 - m2|`` scales the smaller-max state's sum, giving ``a``, ``b`` and
``s = a ± b``; the cancellation flag is set when ``s <= 0`` or (⊖) ``s * 2^cancel_bits < a``;
RECIP of ``s`` gives ``w1 = a/s`` and ``w2 = ±b/s``. Vector phase: one beat per cycle through a
two-stage pipeline (products; add, round, saturate):
``o = sat(round_shift(w1 o1 + w2 o2, mantissa_frac))`` (zeros when flagged). The wide
scalar products are registered before their variable rounding shifts.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.mac_unit import MacUnitConfig, MergeOp
from golden.sfm import SfmOp

from ..lib.arith import round_shift, saturate, stall_all_enable
from ..lib.sfm import Sfm


def merge_in_layout(cfg: MacUnitConfig) -> data.StructLayout:
    lanes = data.ArrayLayout(signed(cfg.out_width), cfg.lanes)
    return data.StructLayout({
        "op": MergeOp,
        "m1": signed(cfg.score_width), "s1": unsigned(cfg.sum_width),
        "m2": signed(cfg.score_width), "s2": unsigned(cfg.sum_width),
        "o1": lanes, "o2": lanes,
    })


def merge_out_layout(cfg: MacUnitConfig) -> data.StructLayout:
    return data.StructLayout({
        "m": signed(cfg.score_width), "s": unsigned(cfg.sum_width), "flagged": unsigned(1),
        "o": data.ArrayLayout(signed(cfg.out_width), cfg.lanes),
    })


class MergeUnit(wiring.Component):
    """``i``: beats of (op, m1, s1, m2, s2, o1 lanes, o2 lanes); ``o``: beats of (m, s, flagged, o lanes)."""

    def __init__(self, cfg: MacUnitConfig):
        self.cfg = cfg
        super().__init__({
            "i": In(stream.Signature(merge_in_layout(cfg))),
            "o": Out(stream.Signature(merge_out_layout(cfg))),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        m.submodules.sfm = sfm = Sfm(cfg.sfm)
        frac, nb = cfg.mantissa_frac, cfg.beats
        p = self.i.payload

        op = Signal()
        first_is_max = Signal()
        m_out = Signal(signed(cfg.score_width))
        x = Signal(signed(cfg.score_width))
        s1, s2 = Signal(cfg.sum_width), Signal(cfg.sum_width)
        a, b = Signal(cfg.sum_width + 1), Signal(cfg.sum_width + 1)
        s_full = Signal(signed(cfg.sum_width + 3))
        s_out = Signal(cfg.sum_width)
        flagged = Signal()
        w1, w2 = Signal(signed(cfg.weight_width)), Signal(signed(cfg.weight_width))
        beat = Signal(range(nb))
        product_width = cfg.sum_width + 1 + cfg.mantissa_frac + 1
        product, product2 = Signal(product_width), Signal(product_width)
        product_shift = Signal(range(cfg.mantissa_frac + (1 << 6)))

        diff = Signal(signed(cfg.score_width + 1))
        m.d.comb += diff.eq(p.m1 - p.m2)
        x_min = cfg.sfm.x_format.min_raw
        neg_abs = Mux(diff >= 0, -diff, diff)

        streaming = Signal()
        ce = stall_all_enable(self.o)
        m.d.comb += self.i.ready.eq(streaming & ce)
        # vector pipeline: stage 1 the two products per lane, stage 2 add, round, saturate
        v1_valid = Signal()
        pw = cfg.weight_width + cfg.out_width
        v1_p1 = [Signal(signed(pw), name=f"v1_p1_{l}") for l in range(cfg.lanes)]
        v1_p2 = [Signal(signed(pw), name=f"v1_p2_{l}") for l in range(cfg.lanes)]
        v1_m, v1_s, v1_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        with m.If(ce):
            m.d.sync += [v1_valid.eq(streaming & self.i.valid), v1_m.eq(m_out), v1_s.eq(s_out), v1_flagged.eq(flagged)]
            m.d.sync += [v1_p1[l].eq(w1 * p.o1[l]) for l in range(cfg.lanes)]
            m.d.sync += [v1_p2[l].eq(w2 * p.o2[l]) for l in range(cfg.lanes)]
            m.d.sync += self.o.valid.eq(v1_valid)
            m.d.sync += [self.o.payload.m.eq(v1_m), self.o.payload.s.eq(v1_s), self.o.payload.flagged.eq(v1_flagged)]
            m.d.sync += [self.o.payload.o[l].eq(saturate(round_shift(v1_p1[l] + v1_p2[l], frac), signed(cfg.out_width)))
                         for l in range(cfg.lanes)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.i.valid):  # peek at the first beat's scalars
                    m.d.sync += [op.eq(p.op), first_is_max.eq(diff >= 0), m_out.eq(Mux(diff >= 0, p.m1, p.m2)),
                                 x.eq(Mux(neg_abs < x_min, x_min, neg_abs)), s1.eq(p.s1), s2.eq(p.s2)]
                    m.next = "EXP_REQUEST"
            with m.State("EXP_REQUEST"):
                m.d.comb += [sfm.i.valid.eq(1), sfm.i.payload.op.eq(SfmOp.EXP2), sfm.i.payload.x.eq(x)]
                with m.If(sfm.i.ready):
                    m.next = "EXP_WAIT"
            with m.State("EXP_WAIT"):
                m.d.comb += sfm.o.ready.eq(1)
                with m.If(sfm.o.valid):
                    m.d.sync += [product.eq(Mux(first_is_max, s2, s1) * sfm.o.payload.value),
                                 product_shift.eq(frac + sfm.o.payload.exponent)]
                    m.next = "SCALE"
            with m.State("SCALE"):
                small = Mux(first_is_max, s2, s1)
                scaled = Mux(x == 0, small, round_shift(product, product_shift))  # exp(0) = 1 exactly
                a_next = Mux(first_is_max, s1, scaled)
                b_next = Mux(first_is_max, scaled, s2)
                m.d.sync += [a.eq(a_next), b.eq(b_next),
                             s_full.eq(Mux(op == MergeOp.DOWNDATE, a_next - b_next, a_next + b_next))]
                m.next = "CHECK"
            with m.State("CHECK"):
                cancel = (s_full <= 0) | ((op == MergeOp.DOWNDATE) & ((s_full << cfg.cancel_bits) < a))
                m.d.sync += [flagged.eq(cancel), s_out.eq(saturate(s_full, unsigned(cfg.sum_width)))]
                with m.If(cancel):
                    m.d.sync += [w1.eq(0), w2.eq(0), s_out.eq(0), beat.eq(0)]
                    m.next = "STREAM"
                with m.Else():
                    m.next = "RECIP_REQUEST"
            with m.State("RECIP_REQUEST"):
                m.d.comb += [sfm.i.valid.eq(1), sfm.i.payload.op.eq(SfmOp.RECIP), sfm.i.payload.z.eq(s_out)]
                with m.If(sfm.i.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.comb += sfm.o.ready.eq(1)
                with m.If(sfm.o.valid):
                    r = sfm.o.payload.value
                    m.d.sync += [product.eq(a * r), product2.eq(b * r), product_shift.eq(sfm.o.payload.exponent)]
                    m.next = "WEIGHTS"
            with m.State("WEIGHTS"):
                weight2 = round_shift(product2, product_shift)
                m.d.sync += [w1.eq(round_shift(product, product_shift)),
                             w2.eq(Mux(op == MergeOp.DOWNDATE, -weight2, weight2)), beat.eq(0)]
                m.next = "STREAM"
            with m.State("STREAM"):
                m.d.comb += streaming.eq(1)
                with m.If(self.i.valid & self.i.ready):
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(beat == nb - 1):
                        m.next = "IDLE"
        return m
