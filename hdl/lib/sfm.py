"""SFM: piecewise-linear exp (with the interval index), reciprocal, and accurate exp (EXP2).

Implements golden/sfm.py bit for bit; the interval boundaries, PWL coefficients and
reciprocal line table are computed there (docs/algorithms.md §1.1) and become constants here.
Five pipeline stages that stall together (one result per cycle): 1. the interval of
``x`` (parallel compares against the boundaries), the leading one of ``z``, the product
``-x log2 e``; 2. normalise ``z`` / round ``u``, slice the table index and offset;
3. look up the coefficients; 4. the one multiply; 5. add, round and saturate.
"""
from __future__ import annotations

from amaranth import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.sfm import EXPONENT_WIDTH, SfmConfig, SfmOp

from .arith import round_shift, saturate, stall_all_enable


def sfm_in_layout(cfg: SfmConfig) -> data.StructLayout:
    return data.StructLayout({
        "op": SfmOp,
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
        kmax = (1 << EXPONENT_WIDTH) - 1

        def stage(name, shape=1):
            return Signal(shape, name=name)

        # Stage 1: interval of x (parallel compares), leading one of z, -x * log2(e).
        s1_valid, s1_op, s1_x, s1_z = stage("s1_valid"), stage("s1_op", 2), stage("s1_x", signed(cfg.x_width)), \
            stage("s1_z", w)
        s1_interval, s1_lead = stage("s1_interval", cfg.interval_width), stage("s1_lead", range(w))
        s1_scaled = stage("s1_scaled", cfg.x_width + 21)
        interval = sum((p.x < e).as_unsigned() for e in cfg.exp_boundaries_raw)
        lead = Signal(range(w))
        for bit in range(w):
            with m.If(p.z[bit]):
                m.d.comb += lead.eq(bit)
        with m.If(ce):
            m.d.sync += [s1_valid.eq(self.i.valid), s1_op.eq(p.op), s1_x.eq(p.x), s1_z.eq(p.z),
                         s1_interval.eq(interval), s1_lead.eq(lead),
                         s1_scaled.eq(Mux(p.x < 0, -p.x, 0) * cfg.log2e_raw)]

        # Stage 2: RECIP normalises z; EXP2 rounds u = -x log2(e); both slice index and offset.
        shift = Signal(range(w))
        norm = Signal(w)
        m.d.comb += [shift.eq(w - 1 - s1_lead), norm.eq(s1_z << shift)]
        frac = norm[:w - 1]
        rest = frac[:w - 1 - cfg.table_index_bits]
        low = w - 1 - cfg.table_index_bits - cfg.table_delta_bits
        recip_index = frac[w - 1 - cfg.table_index_bits:]
        recip_offset = rest[low:] if low >= 0 else rest << -low
        u = Signal(cfg.x_width + 2 + cfg.table_offset_shift)
        m.d.comb += u.eq(round_shift(s1_scaled, cfg.exp2_shift))
        u_int = u[cfg.table_offset_shift:]
        s2_valid, s2_op, s2_x = stage("s2_valid"), stage("s2_op", 2), stage("s2_x", signed(cfg.x_width))
        s2_interval, s2_exponent, s2_special = stage("s2_interval", cfg.interval_width), \
            stage("s2_exponent", EXPONENT_WIDTH), stage("s2_special")
        s2_index, s2_offset = stage("s2_index", cfg.table_index_bits), stage("s2_offset", offset_width)
        with m.If(ce):
            m.d.sync += [s2_valid.eq(s1_valid), s2_op.eq(s1_op), s2_x.eq(s1_x), s2_interval.eq(s1_interval)]
            with m.If(s1_op == SfmOp.EXP2):
                m.d.sync += [
                    s2_exponent.eq(Mux(u_int > kmax, kmax, u_int)), s2_special.eq(u_int > kmax),
                    s2_index.eq(u[cfg.table_delta_bits:cfg.table_offset_shift]),
                    s2_offset.eq(u[:cfg.table_delta_bits] if cfg.table_delta_bits else 0),
                ]
            with m.Else():
                m.d.sync += [s2_exponent.eq(s1_lead), s2_special.eq(s1_z == 0),
                             s2_index.eq(recip_index), s2_offset.eq(recip_offset)]

        # Stage 3: coefficient look-up (PWL line of the interval, or table line).
        mant = unsigned(cfg.mantissa_frac + 1)
        coef = unsigned(cfg.coef_frac + 1)
        slopes = Array(Const(v, coef) for v in cfg.exp_slopes_raw)
        intercepts = Array(Const(v, coef) for v in cfg.exp_intercepts_raw)
        recip_c0 = Array(Const(v, mant) for v in cfg.recip_c0_raw)
        recip_c1 = Array(Const(v, mant) for v in cfg.recip_c1_raw)
        exp2_c0 = Array(Const(v, mant) for v in cfg.exp2_c0_raw)
        exp2_c1 = Array(Const(v, mant) for v in cfg.exp2_c1_raw)
        s3 = {name: stage(f"s3_{name}", shape) for name, shape in (
            ("valid", 1), ("op", 2), ("x", signed(cfg.x_width)), ("interval", cfg.interval_width),
            ("exponent", EXPONENT_WIDTH), ("special", 1), ("offset", offset_width),
            ("slope", coef), ("intercept", coef), ("c0", mant), ("c1", mant))}
        is_exp2 = s2_op == SfmOp.EXP2
        with m.If(ce):
            m.d.sync += [s3["valid"].eq(s2_valid), s3["op"].eq(s2_op), s3["x"].eq(s2_x),
                         s3["interval"].eq(s2_interval), s3["exponent"].eq(s2_exponent),
                         s3["special"].eq(s2_special), s3["offset"].eq(s2_offset),
                         s3["slope"].eq(slopes[s2_interval]), s3["intercept"].eq(intercepts[s2_interval]),
                         s3["c0"].eq(Mux(is_exp2, exp2_c0[s2_index], recip_c0[s2_index])),
                         s3["c1"].eq(Mux(is_exp2, exp2_c1[s2_index], recip_c1[s2_index]))]

        # Stage 4: the one multiply (slope * x, or c1 * offset).
        s4 = {name: stage(f"s4_{name}", shape) for name, shape in (
            ("valid", 1), ("op", 2), ("interval", cfg.interval_width), ("exponent", EXPONENT_WIDTH),
            ("special", 1), ("intercept", coef), ("c0", mant),
            ("exp_product", signed(cfg.coef_frac + 2 + cfg.x_width)),
            ("line_product", unsigned(cfg.mantissa_frac + 1 + offset_width)))}
        with m.If(ce):
            m.d.sync += [s4[k].eq(s3[k]) for k in ("valid", "op", "interval", "exponent", "special", "intercept", "c0")]
            m.d.sync += [s4["exp_product"].eq(s3["slope"] * s3["x"]), s4["line_product"].eq(s3["c1"] * s3["offset"])]

        # Stage 5: add, round, saturate.
        exp_value = saturate(round_shift(s4["exp_product"] + (s4["intercept"] << cfg.x_frac), cfg.exp_shift),
                             unsigned(cfg.out_width))
        mantissa = s4["c0"] - round_shift(s4["line_product"], cfg.table_offset_shift)
        max_mantissa = (1 << (cfg.mantissa_frac + 1)) - 1
        out = self.o.payload
        with m.If(ce):
            m.d.sync += self.o.valid.eq(s4["valid"])
            with m.If(s4["op"] == SfmOp.EXP):
                m.d.sync += [out.value.eq(exp_value), out.exponent.eq(0), out.interval.eq(s4["interval"])]
            with m.Else():
                m.d.sync += [out.value.eq(mantissa), out.interval.eq(0), out.exponent.eq(s4["exponent"])]
                with m.If(s4["special"] & (s4["op"] == SfmOp.RECIP)):
                    m.d.sync += [out.value.eq(max_mantissa), out.exponent.eq(0)]
                with m.If(s4["special"] & (s4["op"] == SfmOp.EXP2)):
                    m.d.sync += out.value.eq(0)
        return m
