"""SFM: piecewise-linear exp (with the interval index), reciprocal, and accurate exp (EXP2).

Implements golden/sfm.py bit for bit; the interval boundaries, PWL coefficients and
reciprocal line table are computed there (ALGORITHMS.md §1.1) and become constants here.
Two pipeline stages that stall together: stage 1 finds the interval of ``x`` (parallel
compares against the boundaries) or the leading one of ``z`` and its table index and
offset, or ``u = -x log2 e`` and its integer part, index and offset; stage 2 does the
one multiply-add (PWL line or table line), the rounding and the saturation.
"""
from __future__ import annotations

from amaranth import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.sfm import EXPONENT_WIDTH, OP_EXP, OP_EXP2, OP_RECIP, SfmConfig

from .arith import round_shift, saturate, stall_all_enable


def sfm_in_layout(cfg: SfmConfig) -> data.StructLayout:
    return data.StructLayout({
        "op": unsigned(2),
        "x": signed(cfg.x_width),
        "z": unsigned(cfg.recip_in_width),
    })


def sfm_out_layout(cfg: SfmConfig) -> data.StructLayout:
    return data.StructLayout({
        "value": unsigned(cfg.value_width),
        "exponent": unsigned(cfg.exponent_width),
        "interval": unsigned(cfg.interval_width),
    })


class Sfm(wiring.Component):
    """Special functions. ``i``: (op, x, z); ``o``: EXP -> (p(x), interval),
    RECIP (of z) and EXP2 (of x) -> (mantissa, exponent)."""

    def __init__(self, cfg: SfmConfig):
        self.cfg = cfg
        super().__init__({
            "i": In(stream.Signature(sfm_in_layout(cfg))),
            "o": Out(stream.Signature(sfm_out_layout(cfg))),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        ce = stall_all_enable(self.o)
        m.d.comb += self.i.ready.eq(ce)
        p = self.i.payload
        w = cfg.recip_in_width
        offset_width = max(1, cfg.table_delta_bits)

        # Stage 1: interval of x; leading one, table index and offset of z.
        interval = Signal(cfg.interval_width)
        m.d.comb += interval.eq(sum((p.x < e).as_unsigned() for e in cfg.exp_boundaries_raw))
        lead = Signal(range(w))
        for bit in range(w):
            with m.If(p.z[bit]):
                m.d.comb += lead.eq(bit)
        shift = Signal(range(w))
        norm = Signal(w)
        m.d.comb += [shift.eq(w - 1 - lead), norm.eq(p.z << shift)]
        frac = norm[:w - 1]
        index = frac[w - 1 - cfg.table_index_bits:]
        rest = frac[:w - 1 - cfg.table_index_bits]
        low = w - 1 - cfg.table_index_bits - cfg.table_delta_bits
        offset = rest[low:] if low >= 0 else rest << -low

        # EXP2: u = -x log2(e) with index+delta fraction bits; k, index, offset are slices.
        neg_x = Signal(cfg.x_width)
        m.d.comb += neg_x.eq(Mux(p.x < 0, -p.x, 0))
        u = Signal(cfg.x_width + 2 + cfg.table_offset_shift)
        m.d.comb += u.eq(round_shift(neg_x * cfg.log2e_raw, cfg.exp2_shift))
        u_int = u[cfg.table_offset_shift:]
        kmax = (1 << EXPONENT_WIDTH) - 1

        s1_valid, s1_op = Signal(), Signal(2)
        s1_x = Signal(signed(cfg.x_width))
        s1_interval = Signal(cfg.interval_width)
        s1_lead = Signal(EXPONENT_WIDTH)
        s1_zero = Signal()
        s1_index = Signal(cfg.table_index_bits)
        s1_offset = Signal(offset_width)
        with m.If(ce):
            m.d.sync += [s1_valid.eq(self.i.valid), s1_op.eq(p.op), s1_x.eq(p.x), s1_interval.eq(interval)]
            with m.If(p.op == OP_EXP2):
                m.d.sync += [
                    s1_lead.eq(Mux(u_int > kmax, kmax, u_int)), s1_zero.eq(u_int > kmax),
                    s1_index.eq(u[cfg.table_delta_bits:cfg.table_offset_shift]),
                    s1_offset.eq(u[:cfg.table_delta_bits] if cfg.table_delta_bits else 0),
                ]
            with m.Else():
                m.d.sync += [s1_lead.eq(lead), s1_zero.eq(p.z == 0), s1_index.eq(index), s1_offset.eq(offset)]

        # Stage 2: one multiply-add, round, saturate.
        slopes = Array(Const(v, unsigned(cfg.coef_frac + 1)) for v in cfg.exp_slopes_raw)
        intercepts = Array(Const(v, unsigned(cfg.coef_frac + 1)) for v in cfg.exp_intercepts_raw)
        mant = unsigned(cfg.mantissa_frac + 1)
        recip_c0 = Array(Const(v, mant) for v in cfg.recip_c0_raw)
        recip_c1 = Array(Const(v, mant) for v in cfg.recip_c1_raw)
        exp2_c0 = Array(Const(v, mant) for v in cfg.exp2_c0_raw)
        exp2_c1 = Array(Const(v, mant) for v in cfg.exp2_c1_raw)
        is_exp2 = s1_op == OP_EXP2
        c0 = Mux(is_exp2, exp2_c0[s1_index], recip_c0[s1_index])
        c1 = Mux(is_exp2, exp2_c1[s1_index], recip_c1[s1_index])
        exp_sum = slopes[s1_interval] * s1_x + (intercepts[s1_interval] << cfg.x_frac)
        exp_value = saturate(round_shift(exp_sum, cfg.exp_shift), unsigned(cfg.out_width))
        mantissa = c0 - round_shift(c1 * s1_offset, cfg.table_offset_shift)
        max_mantissa = (1 << (cfg.mantissa_frac + 1)) - 1
        with m.If(ce):
            m.d.sync += self.o.valid.eq(s1_valid)
            with m.If(s1_op == OP_EXP):
                m.d.sync += [self.o.payload.value.eq(exp_value), self.o.payload.exponent.eq(0),
                             self.o.payload.interval.eq(s1_interval)]
            with m.Else():
                m.d.sync += [self.o.payload.value.eq(mantissa), self.o.payload.interval.eq(0),
                             self.o.payload.exponent.eq(s1_lead)]
                with m.If(s1_zero & (s1_op == OP_RECIP)):
                    m.d.sync += [self.o.payload.value.eq(max_mantissa), self.o.payload.exponent.eq(0)]
                with m.If(s1_zero & is_exp2):
                    m.d.sync += self.o.payload.value.eq(0)
        return m
