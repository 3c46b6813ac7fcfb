"""Merge unit: online-softmax merge (⊕) and removal (⊖) of two attention states.

Implements golden.mac_unit.merge_bits bit for bit (docs/algorithms.md §2: the "⊕" that joins
prefix, band and tail, and the "⊖" downdate that stores cache entries without the last
S keys). A transaction is ``head_dim/lanes`` beats on ``i``; the scalars (op, m1, s1, m2,
s2) are read from its first beat while it waits. Scalar phase, one SFM shared in turn:
EXP2 of ``-|m1 - m2|`` scales the smaller-max state's sum, giving ``a``, ``b`` and
``s = a ± b``; the cancellation flag is set when ``s <= 0`` or (⊖) ``s * 2^cancel_bits < a``;
RECIP of ``s`` gives ``w1 = a/s`` and ``w2 = ±b/s``. Each scalar step is its own cycle:
the partial products of a wide multiply are registered twice (in the MULT18X18D, where
synth/absorb.py moves the first register, then in the fabric), then summed with the
rounding constant, then shifted (docs/synthesis.md).

The transaction's beats are loaded into a buffer (``d/L`` words of both lane vectors)
while its scalar phase runs, so the next transaction's first beat, and with it the next
scalar phase, is visible as soon as the last beat is loaded: the scalar phase of one
transaction overlaps the vector phase of the one before. Vector phase: one beat per cycle
through a six-stage pipeline (buffer read; the read data registered; partial
products, in the DSPs; the products again, in the fabric; sum with the rounding half;
shift and saturate):
``o = sat(round_shift(w1 o1 + w2 o2, mantissa_frac))`` (zeros when flagged).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.mac_unit import MacUnitConfig, MergeOp
from golden.sfm import SfmOp

from ..lib.arith import saturate, stall_all_enable
from ..lib.pipe import csa_sum, partial_products, placed, register_partials
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
        frac, nb, lanes, ow = cfg.mantissa_frac, cfg.beats, cfg.lanes, cfg.out_width
        p = self.i.payload
        ce = stall_all_enable(self.o)

        # -- beat buffer: both lane vectors of each beat of the transaction -----------------
        m.submodules.buf = buf = memory.Memory(shape=unsigned(2 * lanes * ow), depth=nb, init=[])
        wp, rp = buf.write_port(), buf.read_port(domain="sync")
        pending = Signal()      # scalars of the transaction at the head of ``i`` taken, beats not all loaded
        loaded = Signal()       # the buffer holds every beat of the transaction not yet handed off
        load_beat = Signal(range(nb))
        vec_active = Signal()   # the vector phase is reading the buffer
        vec_beat = Signal(range(nb + 1))
        slot_free = ~loaded & (~vec_active | (load_beat < vec_beat))
        m.d.comb += [self.i.ready.eq(pending & slot_free),
                     wp.en.eq(self.i.valid & self.i.ready), wp.addr.eq(load_beat),
                     wp.data.eq(Cat(p.o1.as_value(), p.o2.as_value()))]
        with m.If(wp.en):
            m.d.sync += load_beat.eq(load_beat + 1)
            with m.If(load_beat == nb - 1):
                m.d.sync += [load_beat.eq(0), pending.eq(0), loaded.eq(1)]

        # -- scalar phase ------------------------------------------------------------------
        op = Signal()
        first_is_max, exp_one = Signal(), Signal()
        m_out = Signal(signed(cfg.score_width))
        x = Signal(signed(cfg.score_width))
        s1, s2, small = Signal(cfg.sum_width), Signal(cfg.sum_width), Signal(cfg.sum_width)
        # a and b: s1, s2 or the smaller-max sum scaled by EXP2 of x <= 0 (<= 1, every x checked:
        # docs/mac-unit.md), so sum_width bits hold them
        a, b = Signal(cfg.sum_width), Signal(cfg.sum_width)
        cancel = Signal()       # the cancellation flag of s = a +- b, registered in SUM with sat
        s_out = Signal(cfg.sum_width)
        flagged = Signal()
        ww = cfg.weight_width
        w1, w2 = Signal(signed(ww)), Signal(signed(ww))
        shift = Signal(range(frac + (1 << 6)))
        mant = sfm.o.payload.value

        half = Signal(1 << 6)  # the rounding half of ``shift``: bit shift - 1 (shift <= 64)

        def set_shift(value):
            """shift <= value, with its rounding half (registered with it)."""
            return [shift.eq(value), half.eq(Mux((value >= 1) & (value <= 64), Const(1, 64) << (value - 1).as_unsigned()[:6], 0))]

        def rounding(pieces, width, name):
            """(t, sh, load): the statements ``load`` set t = the product's registered pieces
            plus the rounding half, in one carry chain after carry-save compressors;
            round_shift(product, shift) is ``t >> sh`` for shift <= width (beyond, the product,
            below 2^width, rounds to 0)."""
            t = Signal(width + 1, name=f"{name}_t")
            total = csa_sum(m, placed(pieces) + [half[:width]], width + 1, name)
            return t, shift[:width.bit_length()], [t.eq(total)]

        # The scalar products' pieces, registered twice: when the SFM answers (the register
        # synth/absorb.py moves into the MULT18X18D) and in the next cycle (a fabric register
        # next to the adder), so no path runs from a DSP's pins through logic.
        sfm_ok = sfm.o.valid
        scale_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(small, mant), "scale"), "scale_f")
        w1_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(a, mant), "w1"), "w1_f")
        w2_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(b, mant), "w2"), "w2_f")

        # hand-off to the vector phase: weights (w2 negated for ⊖), m, s, flag
        v_w1, v_w2 = Signal(signed(ww)), Signal(signed(ww + 1))
        v_m, v_s, v_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        handoff = Signal()
        with m.If(handoff):
            m.d.sync += [v_w1.eq(w1), v_w2.eq(Mux(op == MergeOp.DOWNDATE, -w2, w2)), v_m.eq(m_out),
                         v_s.eq(s_out), v_flagged.eq(flagged), loaded.eq(0), vec_active.eq(1), vec_beat.eq(0)]

        diff = Signal(signed(cfg.score_width + 1))
        neg_abs = Signal(signed(cfg.score_width + 1))
        m.d.comb += [diff.eq(p.m1 - p.m2), neg_abs.eq(Mux(diff >= 0, p.m2 - p.m1, diff))]
        peek = Signal()  # take the scalars of the first beat at the head of ``i``
        with m.If(peek):
            m.d.sync += [op.eq(p.op), first_is_max.eq(diff >= 0), m_out.eq(Mux(diff >= 0, p.m1, p.m2)),
                         x.eq(saturate(neg_abs, signed(cfg.score_width))), exp_one.eq(p.m1 == p.m2),
                         s1.eq(p.s1), s2.eq(p.s2), small.eq(Mux(diff >= 0, p.s2, p.s1)), pending.eq(1)]

        # the SFM's operands do not depend on the state (only its valid does): x for EXP2,
        # the saturated sum for RECIP; ``recip`` selects the function
        recip = Signal()
        sat = Signal(cfg.sum_width)   # saturate(a +- b), the RECIP operand
        m.d.comb += [sfm.i.payload.op.eq(Mux(recip, SfmOp.RECIP, SfmOp.EXP2)), sfm.i.payload.x.eq(x),
                     sfm.i.payload.z.eq(sat)]
        with m.If(peek):
            m.d.sync += recip.eq(0)

        scale_width = len(small) + len(mant)
        scale_t, scale_sh, scale_load = rounding(scale_pp, scale_width, "scale")
        scale_zero = Signal()   # EXP2's shift past the product's width (maxima far apart): 0
        # (RECIP's exponent is below sum_width, so its shift never passes the weights' products' width)
        w1_t, w1_sh, w1_load = rounding(w1_pp, len(a) + len(mant), "w1")
        w2_t, w2_sh, w2_load = rounding(w2_pp, len(b) + len(mant), "w2")
        # the flag from a and b (unsigned), beside s's own add rather than after it (after it, the
        # compare's carry chain fed the FSM: mac-unit's critical path, 103 MHz): s <= 0 is a = b = 0
        # for ⊕; for ⊖, s <= 0 (a <= b) or s 2^cancel_bits < a is the sign of
        # (a << cancel_bits) - (b << cancel_bits) - a (negative whenever a <= b, but for a = b = 0),
        # three terms summed in one carry chain
        cb = cfg.cancel_bits
        cw = len(a) + cb + 2
        down_terms = [Cat(Const(0, cb), a), ~Cat(Const(0, cb), b, Const(0, cw - cb - len(b))),
                      ~Cat(a, Const(0, cw - len(a))), Const(2, cw)]
        both_zero, down_sign = (a == 0) & (b == 0), csa_sum(m, down_terms, cw, "cancel")[-1]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += peek.eq(self.i.valid & ~pending & ~loaded)
                with m.If(peek):
                    m.next = "EXP_REQUEST"
            with m.State("EXP_REQUEST"):
                m.d.comb += sfm.i.valid.eq(1)
                with m.If(sfm.i.ready):
                    m.next = "EXP_WAIT"
            with m.State("EXP_WAIT"):
                m.d.comb += sfm.o.ready.eq(1)
                with m.If(sfm.o.valid):
                    m.d.sync += set_shift(frac + sfm.o.payload.exponent)
                    m.next = "SCALE_PRODUCT"
            with m.State("SCALE_PRODUCT"):   # the products move from the DSPs to the fabric
                m.next = "SCALE_SUM"
            with m.State("SCALE_SUM"):
                m.d.sync += [*scale_load, scale_zero.eq(shift > scale_width)]
                m.next = "SCALE_SHIFT"
            with m.State("SCALE_SHIFT"):
                scaled = Mux(exp_one, small, Mux(scale_zero, 0, scale_t >> scale_sh))  # exp(0) = 1 exactly
                m.d.sync += [a.eq(Mux(first_is_max, s1, scaled)), b.eq(Mux(first_is_max, scaled, s2))]
                m.next = "SUM"
            with m.State("SUM"):
                s_next = Mux(op == MergeOp.DOWNDATE, a - b, a + b)
                m.d.sync += [sat.eq(saturate(s_next, unsigned(cfg.sum_width))), recip.eq(1),
                             cancel.eq(both_zero | ((op == MergeOp.DOWNDATE) & down_sign))]
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += sfm.i.valid.eq(~cancel)
                m.d.sync += [flagged.eq(cancel), s_out.eq(sat)]
                with m.If(cancel):
                    m.d.sync += [w1.eq(0), w2.eq(0), s_out.eq(0)]
                    m.next = "DONE"
                with m.Elif(sfm.i.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.comb += sfm.o.ready.eq(1)
                with m.If(sfm.o.valid):
                    m.d.sync += set_shift(sfm.o.payload.exponent)
                    m.next = "WEIGHT_PRODUCT"
            with m.State("WEIGHT_PRODUCT"):
                m.next = "WEIGHT_SUM"
            with m.State("WEIGHT_SUM"):
                m.d.sync += w1_load + w2_load
                m.next = "WEIGHT_SHIFT"
            with m.State("WEIGHT_SHIFT"):
                m.d.sync += [w1.eq(w1_t >> w1_sh), w2.eq(w2_t >> w2_sh)]
                m.next = "DONE"
            with m.State("DONE"):  # hand off; take the next transaction's scalars in the same cycle
                with m.If(~vec_active & loaded):
                    m.d.comb += [handoff.eq(1), peek.eq(self.i.valid & ~pending)]
                    with m.If(peek):
                        m.next = "EXP_REQUEST"
                    with m.Else():
                        m.next = "IDLE"

        # -- vector phase: buffer read; lane registers; partial products; sum; round and saturate
        m.d.comb += [rp.addr.eq(vec_beat), rp.en.eq(ce)]
        v0_valid, v0_w1, v0_w2 = Signal(), Signal(signed(ww)), Signal(signed(ww + 1))
        v0_m, v0_s, v0_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        with m.If(ce):
            m.d.sync += [v0_valid.eq(vec_active), v0_w1.eq(v_w1), v0_w2.eq(v_w2), v0_m.eq(v_m), v0_s.eq(v_s),
                         v0_flagged.eq(v_flagged)]
            with m.If(vec_active):
                m.d.sync += vec_beat.eq(vec_beat + 1)
                with m.If(vec_beat == nb - 1):
                    m.d.sync += vec_active.eq(0)
        # the beat buffer's read data registered (next to each lane's multipliers), the
        # weights delayed with it
        va_valid = Signal()
        va_m, va_s, va_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        o1 = [Signal(signed(ow), name=f"va_o1_{l}") for l in range(lanes)]
        o2 = [Signal(signed(ow), name=f"va_o2_{l}") for l in range(lanes)]
        va_w1, va_w2 = Signal(signed(ww)), Signal(signed(ww + 1))
        with m.If(ce):
            m.d.sync += [va_valid.eq(v0_valid), va_m.eq(v0_m), va_s.eq(v0_s), va_flagged.eq(v0_flagged)]
            m.d.sync += [o1[l].eq(rp.data[l * ow:(l + 1) * ow]) for l in range(lanes)]
            m.d.sync += [o2[l].eq(rp.data[(lanes + l) * ow:(lanes + l + 1) * ow]) for l in range(lanes)]
            m.d.sync += [va_w1.eq(v0_w1), va_w2.eq(v0_w2)]
        v1_valid = Signal()
        v1_m, v1_s, v1_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        v1_pp = [register_partials(m, ce, partial_products(va_w1, o1[l]) + partial_products(va_w2, o2[l]),
                                   f"v1_{l}") for l in range(lanes)]
        # the products again, in the fabric (the first register goes into the DSP)
        vb_valid = Signal()
        vb_m, vb_s, vb_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        vb_pp = [register_partials(m, ce, v1_pp[l], f"vb_{l}") for l in range(lanes)]
        v2_valid = Signal()
        v2_m, v2_s, v2_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        v2_sum = [Signal(signed(ww + ow + 2), name=f"v2_sum{l}") for l in range(lanes)]   # w1 o1 + w2 o2 + half
        half_frac = (1 << (frac - 1)) if frac > 0 else 0
        v2_next = [csa_sum(m, placed(vb_pp[l]) + [Const(half_frac, len(v2_sum[l]))], len(v2_sum[l]), f"v2_{l}")
                   for l in range(lanes)]
        with m.If(ce):
            m.d.sync += [v1_valid.eq(va_valid), v1_m.eq(va_m), v1_s.eq(va_s), v1_flagged.eq(va_flagged)]
            m.d.sync += [vb_valid.eq(v1_valid), vb_m.eq(v1_m), vb_s.eq(v1_s), vb_flagged.eq(v1_flagged)]
            m.d.sync += [v2_valid.eq(vb_valid), v2_m.eq(vb_m), v2_s.eq(vb_s), v2_flagged.eq(vb_flagged)]
            # the rounding half of round_shift(., frac) is one more carry-save term, so the
            # last stage is a shift and a saturate (no second carry chain)
            m.d.sync += [v2_sum[l].eq(v2_next[l].as_signed()) for l in range(lanes)]
            m.d.sync += [self.o.valid.eq(v2_valid), self.o.payload.m.eq(v2_m), self.o.payload.s.eq(v2_s),
                         self.o.payload.flagged.eq(v2_flagged)]
            m.d.sync += [self.o.payload.o[l].eq(saturate(v2_sum[l] >> frac, signed(ow))) for l in range(lanes)]
        return m
