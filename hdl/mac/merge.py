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
transaction overlaps the vector phase of the one before. The buffer has two halves, one
loading while the vector phase reads the other, so ``i.ready`` is a flip-flop (its
``pending``: the scalars taken, the beats not all loaded), not a compare of the load
against the vector phase's read. Vector phase: one beat per cycle
through a six-stage pipeline (buffer read; the read data registered; partial
products, in the DSPs; the products again, in the fabric; sum with the rounding half;
shift and saturate):
``o = sat(round_shift(w1 o1 + w2 o2, mantissa_frac))`` (zeros when flagged).
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.mac_unit import MacUnitConfig, MergeOp
from golden.sfm import SfmOp

from ..lib.arith import saturate, set_ready, stall_all_enable
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


class _BeatBuffer(NamedTuple):
    """The beat buffer's read port and the state shared by its loading and the vector phase."""
    rp: object
    pending: Signal
    loaded: Signal
    vec_active: Signal
    vec_beat: Signal
    load_half: Signal   # the half of the buffer the next transaction loads into
    vec_half: Signal    # the half the vector phase reads


class _ScalarRegs(NamedTuple):
    """The scalar phase's registers and the SFM's mantissa output (``mant``)."""
    op: Signal
    first_is_max: Signal
    exp_one: Signal
    m_out: Signal
    x: Signal
    s1: Signal
    s2: Signal
    small: Signal
    a: Signal
    b: Signal
    cancel: Signal
    s_out: Signal
    flagged: Signal
    w1: Signal
    w2: Signal
    shift: Signal
    half: Signal
    mant: object


class _Handoff(NamedTuple):
    """A transaction's weights (w2 negated for ⊖), m, s and flag as the vector phase takes them."""
    v_w1: Signal
    v_w2: Signal
    v_m: Signal
    v_s: Signal
    v_flagged: Signal
    handoff: Signal


class _ScalarSums(NamedTuple):
    """The scalar products' rounded sums (``t >> sh`` after ``load``) and the cancellation terms."""
    scale_t: Signal
    scale_sh: object
    scale_load: list
    scale_width: int
    scale_zero: Signal
    w1_t: Signal
    w1_sh: object
    w1_load: list
    w2_t: Signal
    w2_sh: object
    w2_load: list
    both_zero: object
    down_sign: object


def _set_shift(sc: _ScalarRegs, value):
    """shift <= value, with its rounding half (registered with it)."""
    return [sc.shift.eq(value),
            sc.half.eq(Mux((value >= 1) & (value <= 64), Const(1, 64) << (value - 1).as_unsigned()[:6], 0))]


def _rounding(m, sc: _ScalarRegs, pieces, width, name):
    """(t, sh, load): the statements ``load`` set t = the product's registered pieces
    plus the rounding half, in one carry chain after carry-save compressors;
    round_shift(product, shift) is ``t >> sh`` for shift <= width (beyond, the product,
    below 2^width, rounds to 0)."""
    t = Signal(width + 1, name=f"{name}_t")
    total = csa_sum(m, placed(pieces) + [sc.half[:width]], width + 1, name)
    return t, sc.shift[:width.bit_length()], [t.eq(total)]


class MergeUnit(wiring.Component):
    """``i``: beats of (op, m1, s1, m2, s2, o1 lanes, o2 lanes); ``o``: beats of (m, s, flagged, o lanes).

    ``stall_free``: ``o`` is always ready and the vector pipeline has no clock enable, for a user
    that takes every beat as it comes (mac-decode's MERGE state, which ends after the last): the
    same beats on the same cycles, without the enable net that was its slowest routed path. Its
    SFM is then stall-free too (the scalar FSM waits for each of its results with ``ready`` high)."""

    def __init__(self, cfg: MacUnitConfig, stall_free: bool = False):
        self.cfg, self.stall_free = cfg, stall_free
        super().__init__({
            "i": In(stream.Signature(merge_in_layout(cfg))),
            "o": Out(stream.Signature(merge_out_layout(cfg), always_ready=stall_free)),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        m.submodules.sfm = sfm = Sfm(replace(cfg.sfm, stall_free=True) if self.stall_free else cfg.sfm)
        ce = stall_all_enable(self.o)
        buf = self._beat_buffer(m)
        sc = self._scalar_registers(sfm)
        products = self._scalar_products(m, sfm, sc)
        vh = self._handoff(m, sc, buf)
        peek, recip, sat = self._scalar_operands(m, sfm, sc, buf)
        sums = self._scalar_sums(m, sc, products)
        self._scalar_fsm(m, sfm, sc, buf, vh, sums, peek, recip, sat)
        self._vector_pipeline(m, ce, buf, vh)
        return m

    def _beat_buffer(self, m) -> _BeatBuffer:
        """The beat buffer: both lane vectors of each beat of the transaction, loaded from ``i``."""
        nb, lanes, ow = self.cfg.beats, self.cfg.lanes, self.cfg.out_width
        p = self.i.payload
        load_beat = Signal(range(nb))
        # two halves of 2^len(load_beat) words each: a word's address is its beat and its half
        m.submodules.buf = buf = memory.Memory(shape=unsigned(2 * lanes * ow), depth=2 << len(load_beat), init=[])
        # (the ports as one tuple: Amaranth's tracer finds no name for them and keeps its defaults)
        ports = buf.write_port(), buf.read_port(domain="sync")
        wp, rp = ports
        pending = Signal()      # scalars of the transaction at the head of ``i`` taken, beats not all loaded
        loaded = Signal()       # a half holds every beat of the transaction not yet handed off
        load_half, vec_half = Signal(), Signal()
        vec_active = Signal()   # the vector phase is reading its half
        vec_beat = Signal(range(nb + 1))
        # pending and loaded are never both set (the scalars are taken only when no transaction
        # waits loaded, or as it is handed off), and the half loading is not the half the vector
        # phase reads: the vector phase takes a transaction only once it is loaded, and the next
        # load starts after that hand-off, into the other half
        m.d.comb += [self.i.ready.eq(pending),
                     wp.en.eq(self.i.valid & pending), wp.addr.eq(Cat(load_beat, load_half)),
                     wp.data.eq(Cat(p.o1.as_value(), p.o2.as_value()))]
        with m.If(wp.en):
            m.d.sync += load_beat.eq(load_beat + 1)
            with m.If(load_beat == nb - 1):
                m.d.sync += [load_beat.eq(0), pending.eq(0), loaded.eq(1), load_half.eq(~load_half)]
        return _BeatBuffer(rp, pending, loaded, vec_active, vec_beat, load_half, vec_half)

    def _scalar_registers(self, sfm) -> _ScalarRegs:
        """The scalar phase's registers: the taken scalars, a and b, the sum, flag, weights, shift."""
        cfg = self.cfg
        frac = cfg.mantissa_frac
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
        return _ScalarRegs(op, first_is_max, exp_one, m_out, x, s1, s2, small, a, b, cancel, s_out, flagged,
                           w1, w2, shift, half, mant)

    def _scalar_products(self, m, sfm, sc: _ScalarRegs):
        """The scalar multiplies' partial products (small, a, b times the SFM's mantissa), registered twice."""
        # The scalar products' pieces, registered twice: when the SFM answers (the register
        # synth/absorb.py moves into the MULT18X18D) and in the next cycle (a fabric register
        # next to the adder), so no path runs from a DSP's pins through logic.
        small, a, b, mant = sc.small, sc.a, sc.b, sc.mant
        sfm_ok = sfm.o.valid
        scale_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(small, mant), "scale"), "scale_f")
        w1_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(a, mant), "w1"), "w1_f")
        w2_pp = register_partials(m, 1, register_partials(m, sfm_ok, partial_products(b, mant), "w2"), "w2_f")
        return scale_pp, w1_pp, w2_pp

    def _handoff(self, m, sc: _ScalarRegs, buf: _BeatBuffer) -> _Handoff:
        """The registers that hand a transaction's weights, m, s and flag to the vector phase."""
        cfg, ww = self.cfg, self.cfg.weight_width
        # hand-off to the vector phase: weights (w2 negated for ⊖), m, s, flag
        v_w1, v_w2 = Signal(signed(ww)), Signal(signed(ww + 1))
        v_m, v_s, v_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        handoff = Signal()
        with m.If(handoff):
            m.d.sync += [v_w1.eq(sc.w1), v_w2.eq(Mux(sc.op == MergeOp.DOWNDATE, -sc.w2, sc.w2)), v_m.eq(sc.m_out),
                         v_s.eq(sc.s_out), v_flagged.eq(sc.flagged), buf.loaded.eq(0), buf.vec_active.eq(1),
                         buf.vec_beat.eq(0), buf.vec_half.eq(~buf.load_half)]   # (the half last loaded)
        return _Handoff(v_w1, v_w2, v_m, v_s, v_flagged, handoff)

    def _scalar_operands(self, m, sfm, sc: _ScalarRegs, buf: _BeatBuffer):
        """The scalars taken from the first beat at the head of ``i`` (``peek``) and the SFM's operands."""
        cfg, p = self.cfg, self.i.payload
        diff = Signal(signed(cfg.score_width + 1))
        neg_abs = Signal(signed(cfg.score_width + 1))
        m.d.comb += [diff.eq(p.m1 - p.m2), neg_abs.eq(Mux(diff >= 0, p.m2 - p.m1, diff))]
        peek = Signal()  # take the scalars of the first beat at the head of ``i``
        with m.If(peek):
            m.d.sync += [sc.op.eq(p.op), sc.first_is_max.eq(diff >= 0), sc.m_out.eq(Mux(diff >= 0, p.m1, p.m2)),
                         sc.x.eq(saturate(neg_abs, signed(cfg.score_width))), sc.exp_one.eq(p.m1 == p.m2),
                         sc.s1.eq(p.s1), sc.s2.eq(p.s2), sc.small.eq(Mux(diff >= 0, p.s2, p.s1)),
                         buf.pending.eq(1)]

        # the SFM's operands do not depend on the state (only its valid does): x for EXP2,
        # the saturated sum for RECIP; ``recip`` selects the function
        recip = Signal()
        sat = Signal(cfg.sum_width)   # saturate(a +- b), the RECIP operand
        m.d.comb += [sfm.i.payload.op.eq(Mux(recip, SfmOp.RECIP, SfmOp.EXP2)), sfm.i.payload.x.eq(sc.x),
                     sfm.i.payload.z.eq(sat)]
        with m.If(peek):
            m.d.sync += recip.eq(0)
        return peek, recip, sat

    def _scalar_sums(self, m, sc: _ScalarRegs, products) -> _ScalarSums:
        """The products' rounded sums (scale, w1, w2) and the cancellation flag's carry chain."""
        cfg = self.cfg
        scale_pp, w1_pp, w2_pp = products
        a, b = sc.a, sc.b
        scale_width = len(sc.small) + len(sc.mant)
        scale_t, scale_sh, scale_load = _rounding(m, sc, scale_pp, scale_width, "scale")
        scale_zero = Signal()   # EXP2's shift past the product's width (maxima far apart): 0
        # (RECIP's exponent is below sum_width, so its shift never passes the weights' products' width)
        w1_t, w1_sh, w1_load = _rounding(m, sc, w1_pp, len(a) + len(sc.mant), "w1")
        w2_t, w2_sh, w2_load = _rounding(m, sc, w2_pp, len(b) + len(sc.mant), "w2")
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
        return _ScalarSums(scale_t, scale_sh, scale_load, scale_width, scale_zero, w1_t, w1_sh, w1_load,
                           w2_t, w2_sh, w2_load, both_zero, down_sign)

    def _scalar_fsm(self, m, sfm, sc: _ScalarRegs, buf: _BeatBuffer, vh: _Handoff, sums: _ScalarSums,
                    peek, recip, sat):
        """The scalar phase's FSM: EXP2, scale, sum and flag, RECIP, weights, hand-off."""
        cfg, frac = self.cfg, self.cfg.mantissa_frac
        a, b, shift, cancel = sc.a, sc.b, sc.shift, sc.cancel
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += peek.eq(self.i.valid & ~buf.pending & ~buf.loaded)
                with m.If(peek):
                    m.next = "EXP_REQUEST"
            with m.State("EXP_REQUEST"):
                m.d.comb += sfm.i.valid.eq(1)
                with m.If(sfm.i.ready):
                    m.next = "EXP_WAIT"
            with m.State("EXP_WAIT"):
                set_ready(m, sfm.o, 1)
                with m.If(sfm.o.valid):
                    m.d.sync += _set_shift(sc, frac + sfm.o.payload.exponent)
                    m.next = "SCALE_PRODUCT"
            with m.State("SCALE_PRODUCT"):   # the products move from the DSPs to the fabric
                m.next = "SCALE_SUM"
            with m.State("SCALE_SUM"):
                m.d.sync += [*sums.scale_load, sums.scale_zero.eq(shift > sums.scale_width)]
                m.next = "SCALE_SHIFT"
            with m.State("SCALE_SHIFT"):
                scaled = Mux(sc.exp_one, sc.small,
                             Mux(sums.scale_zero, 0, sums.scale_t >> sums.scale_sh))  # exp(0) = 1 exactly
                m.d.sync += [a.eq(Mux(sc.first_is_max, sc.s1, scaled)), b.eq(Mux(sc.first_is_max, scaled, sc.s2))]
                m.next = "SUM"
            with m.State("SUM"):
                s_next = Mux(sc.op == MergeOp.DOWNDATE, a - b, a + b)
                m.d.sync += [sat.eq(saturate(s_next, unsigned(cfg.sum_width))), recip.eq(1),
                             cancel.eq(sums.both_zero | ((sc.op == MergeOp.DOWNDATE) & sums.down_sign))]
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += sfm.i.valid.eq(~cancel)
                m.d.sync += [sc.flagged.eq(cancel), sc.s_out.eq(sat)]
                with m.If(cancel):
                    m.d.sync += [sc.w1.eq(0), sc.w2.eq(0), sc.s_out.eq(0)]
                    m.next = "DONE"
                with m.Elif(sfm.i.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                set_ready(m, sfm.o, 1)
                with m.If(sfm.o.valid):
                    m.d.sync += _set_shift(sc, sfm.o.payload.exponent)
                    m.next = "WEIGHT_PRODUCT"
            with m.State("WEIGHT_PRODUCT"):
                m.next = "WEIGHT_SUM"
            with m.State("WEIGHT_SUM"):
                m.d.sync += sums.w1_load + sums.w2_load
                m.next = "WEIGHT_SHIFT"
            with m.State("WEIGHT_SHIFT"):
                m.d.sync += [sc.w1.eq(sums.w1_t >> sums.w1_sh), sc.w2.eq(sums.w2_t >> sums.w2_sh)]
                m.next = "DONE"
            with m.State("DONE"):  # hand off; take the next transaction's scalars in the same cycle
                with m.If(~buf.vec_active & buf.loaded):
                    m.d.comb += [vh.handoff.eq(1), peek.eq(self.i.valid & ~buf.pending)]
                    with m.If(peek):
                        m.next = "EXP_REQUEST"
                    with m.Else():
                        m.next = "IDLE"

    def _vector_pipeline(self, m, ce, buf: _BeatBuffer, vh: _Handoff):
        """The vector phase: buffer read; lane registers; partial products; sum; round and saturate."""
        cfg = self.cfg
        frac, nb, lanes, ow, ww = cfg.mantissa_frac, cfg.beats, cfg.lanes, cfg.out_width, cfg.weight_width
        rp, vec_active, vec_beat = buf.rp, buf.vec_active, buf.vec_beat
        m.d.comb += [rp.addr.eq(Cat(vec_beat[:(nb - 1).bit_length()], buf.vec_half)), rp.en.eq(ce)]   # (load_beat's bits)
        v0_valid, v0_w1, v0_w2 = Signal(), Signal(signed(ww)), Signal(signed(ww + 1))
        v0_m, v0_s, v0_flagged = Signal(signed(cfg.score_width)), Signal(cfg.sum_width), Signal()
        with m.If(ce):
            m.d.sync += [v0_valid.eq(vec_active), v0_w1.eq(vh.v_w1), v0_w2.eq(vh.v_w2), v0_m.eq(vh.v_m),
                         v0_s.eq(vh.v_s), v0_flagged.eq(vh.v_flagged)]
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
