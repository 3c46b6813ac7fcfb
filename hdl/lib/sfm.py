"""SFM: piecewise-linear exp (with the interval index), reciprocal, and accurate exp (EXP2).

Implements golden/sfm.py bit for bit; the interval boundaries, PWL coefficients and
reciprocal line table are computed there (docs/algorithms.md §1.1) and become constants here.
Seven pipeline stages that stall together (one result per cycle, latency 7): 1. compares
of ``x`` against the interval boundaries, the leading one of ``z``, ``-x`` and its clamp compares;
2. the interval index, normalise ``z``, ``|x|`` (clamped) times ``log2 e`` as two carry-save terms (the constant's
shift-and-add in LUTs, ``pipe.constant_product``: no DSP, no carry chain), registered;
3. sum and round ``u``, slice exponent, table index and offset;
4. look up the coefficients (the line intercept pre-shifted with the rounding folded in; EXP's
slope a stage earlier, so both multiplier operands of stage 5 come straight from registers);
5. the one multiply; 6. one add or subtract; 7. saturate and select the output. Each stage
holds at most one multiplier or one long carry chain, and nothing after a carry chain but its
register (docs/synthesis.md). With ``cfg.stall_free`` the stages never stall (no clock
enable, both streams always ready: for a user that takes every result as it comes). With
``cfg.dsp_registers`` stage 5's operands and products are registered twice (latency 9):
``synth/absorb.py`` moves one register of each into the MULT18X18D, so only routing lies between
the DSP's pins and a fabric register, wherever the placer finds a free DSP. Without
``cfg.with_exp`` EXP is not built (no boundary compares, PWL tables, EXP multiply or sum): a user
of RECIP and EXP2 alone, as the MAC blocks are, saves their logic and a multiplier.
"""
from __future__ import annotations

import torch
from amaranth import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.fixedpoint import rounding_half
from golden.sfm import EXPONENT_WIDTH, SfmConfig, SfmOp, exp_interval

from .arith import round_shift, saturate, set_ready, stall_all_enable
from .pipe import constant_product, csa_sum, leading_one, partial_products, placed, register_partials


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


def exp2_clamp(cfg: SfmConfig) -> int:
    """Smallest ``|x|`` (raw) whose EXP2 exponent exceeds ``kmax``: every larger ``|x|``
    gives the same result (mantissa 0, exponent kmax), so the RTL clamps ``|x|`` at the power of
    two at or above it (stage 1) and its constant product is no wider than that
    (``|x| <= 2^(x_width-1)`` where that is smaller)."""
    limit = ((1 << EXPONENT_WIDTH) << cfg.table_offset_shift)  # u >= limit <=> k > kmax
    half = rounding_half(cfg.exp2_shift)
    # round_shift(a * L, s) >= limit  <=>  a * L + half >= limit << s
    need = (limit << cfg.exp2_shift) - half if cfg.exp2_shift >= 0 else limit >> -cfg.exp2_shift
    amax = -(-need // cfg.log2e_raw)
    return min(amax, 1 << (cfg.x_width - 1))


def signed_width(lo: int, hi: int) -> int:
    """Bits of the narrowest signed format holding every integer in ``[lo, hi]``."""
    return 1 + max(v.bit_length() if v >= 0 else (-v - 1).bit_length() for v in (lo, hi))


def exp_sum_width(cfg: SfmConfig, bias_raw: list[int]) -> int:
    """Signed width of EXP's sum ``a_r x + bias_r`` over every raw ``x`` of every interval ``r``
    (``golden.sfm.exp_interval``'s index).
    The sum is linear in ``x`` within an interval, so its extremes lie at the intervals' ends: a
    boundary ``e`` or ``e - 1``, or an end of x's format."""
    xf = cfg.x_format
    ends = {xf.min_raw, xf.max_raw}
    ends |= {min(max(e + d, xf.min_raw), xf.max_raw) for e in cfg.exp_boundaries_raw for d in (-1, 0)}
    xs = sorted(ends)
    sums = [cfg.exp_slopes_raw[r] * x + bias_raw[r]
            for x, r in zip(xs, exp_interval(torch.tensor(xs), cfg).tolist())]
    return signed_width(min(sums), max(sums))


def _stage(prefix, **shapes):
    """One pipeline stage's registers, named ``<prefix>_<field>``."""
    return {name: Signal(shape, name=f"{prefix}_{name}") for name, shape in shapes.items()}


def _copy_stage(m, ce, src, prefix):
    """A stage that holds every field of ``src`` a cycle later (loaded when ``ce``)."""
    dst = {name: Signal.like(sig, name=f"{prefix}_{name}") for name, sig in src.items()}
    with m.If(ce):
        m.d.sync += _carry(dst, src, *src)
    return dst


def _carry(dst, src, *names):
    """The statements that pass fields ``names`` of stage ``src`` on to stage ``dst``."""
    return [dst[k].eq(src[k]) for k in names]


def _slope_shape(cfg: SfmConfig):
    """EXP's slope constants (>= 0: exp rises)."""
    return unsigned(max(1, max(cfg.exp_slopes_raw).bit_length()))


def _mantissa_shape(cfg: SfmConfig):
    """The table lines' slopes c1 (>= 0)."""
    return unsigned(max(1, max(cfg.recip_c1_raw + cfg.exp2_c1_raw).bit_length()))


def _c0_shape(cfg: SfmConfig, fold):
    """The table lines' intercepts, pre-shifted with the rounding folded in (``fold``)."""
    return unsigned(max(1, max(fold(v) for v in cfg.recip_c0_raw + cfg.exp2_c0_raw).bit_length()))


class Sfm(wiring.Component):
    """Special functions. ``i``: (op, x, z); ``o``: EXP -> (p(x), interval),
    RECIP (of z) and EXP2 (of x) -> (mantissa, exponent)."""

    def __init__(self, cfg: SfmConfig):
        self.cfg = cfg
        super().__init__({
            "i": In(stream.Signature(sfm_in_layout(cfg), always_ready=cfg.stall_free)),
            "o": Out(stream.Signature(sfm_out_layout(cfg), always_ready=cfg.stall_free)),
        })

    def elaborate(self, platform):
        m = Module()
        ce = stall_all_enable(self.o)
        set_ready(m, self.i, ce)
        s1, ax, amax = self._compare_stage(m, ce)
        s2, scaled, u_width = self._normalise_stage(m, ce, s1, ax, amax)
        s3 = self._exponent_stage(m, ce, s2, scaled, u_width)
        s4, bias_raw = self._lookup_stage(m, ce, s3)
        s5, exp_pieces = self._multiply_stage(m, ce, s4)
        s6 = self._sum_stage(m, ce, s5, exp_pieces, bias_raw)
        self._output_stage(m, ce, s6)
        return m

    def _compare_stage(self, m, ce):
        """Stage 1: the boundary compares of x, the leading one of z, EXP2's -x and its clamp."""
        cfg, p = self.cfg, self.i.payload
        w = cfg.recip_in_width
        # Stage 1: compares of x against the boundaries, leading one of z, and for EXP2's |x|: -x
        # and whether to clamp it (|x| is 0 for x >= 0 and 2^clamp_bits for x < -2^clamp_bits, a
        # power of two >= exp2_clamp: every |x| from exp2_clamp up gives the same result). That
        # compare is the sign and an AND of the bits above clamp_bits (LUTs, no carry chain), and
        # the clamp's select is applied in stage 2 from registers (applied here, a compare fanned
        # out to every bit of |x|: mac-unit's critical path).
        bounds = cfg.exp_boundaries_raw if cfg.with_exp else []
        clamp_bits = (exp2_clamp(cfg) - 1).bit_length()
        amax = 1 << clamp_bits
        ax_width = clamp_bits + 1
        s1 = _stage("s1", valid=1, op=2, x=signed(cfg.x_width), z=w, lt=max(1, len(bounds)), lead=range(w),
                    zero=1, neg_x=ax_width, clamp=1, negative=1)
        lead = Signal(range(w))
        m.d.comb += lead.eq(leading_one(p.z))
        neg_x = Signal(cfg.x_width + 1)
        m.d.comb += neg_x.eq(-p.x)
        sign = p.x[-1]
        below = sign & ~p.x[clamp_bits:cfg.x_width - 1].all() if clamp_bits < cfg.x_width - 1 else Const(0)
        with m.If(ce):
            m.d.sync += [s1["valid"].eq(self.i.valid), s1["op"].eq(p.op), s1["x"].eq(p.x), s1["z"].eq(p.z),
                         s1["lead"].eq(lead), s1["zero"].eq(p.z == 0), s1["neg_x"].eq(neg_x[:ax_width]),
                         s1["clamp"].eq(~sign | below), s1["negative"].eq(sign)]
            m.d.sync += [s1["lt"][n].eq(p.x < e) for n, e in enumerate(bounds)]
        ax = Signal(ax_width)
        m.d.comb += ax.eq(Mux(s1["clamp"], Mux(s1["negative"], amax, 0), s1["neg_x"]))
        return s1, ax, amax

    def _normalise_stage(self, m, ce, s1, ax, amax):
        """Stage 2: the interval index, normalised z and |x| log2(e) as carry-save terms."""
        cfg = self.cfg
        w = cfg.recip_in_width
        bounds = cfg.exp_boundaries_raw if cfg.with_exp else []
        # Stage 2: interval index (boundaries above x), normalised z, |x| * log2(e) as two
        # carry-save terms (the constant's shifted copies of |x| in LUTs; summed in stage 3).
        s2 = _stage("s2", valid=1, op=2, x=signed(cfg.x_width), interval=cfg.interval_width, lead=range(w),
                    zero=1, norm=w)
        shift = Signal(range(w))
        m.d.comb += shift.eq(w - 1 - s1["lead"])
        with m.If(ce):
            m.d.sync += _carry(s2, s1, "valid", "op", "x", "lead", "zero")
            m.d.sync += [s2["norm"].eq(s1["z"] << shift),
                         s2["interval"].eq(sum((s1["lt"][n].as_unsigned() for n in range(len(bounds))), Const(0)))]
        half = rounding_half(cfg.exp2_shift)
        u_width = (amax * cfg.log2e_raw + half).bit_length()   # u's largest value, at |x| = amax
        scaled_terms = constant_product(m, ax, cfg.log2e_raw, u_width, "s2_log2e")
        scaled = [Signal(u_width, name=f"s2_scaled{n}") for n in range(len(scaled_terms))]
        with m.If(ce):
            m.d.sync += [r.eq(t) for r, t in zip(scaled, scaled_terms)]
        return s2, scaled, u_width

    def _exponent_stage(self, m, ce, s2, scaled, u_width):
        """Stage 3: EXP2's rounded u or RECIP's normalised z as exponent, table index and offset."""
        cfg = self.cfg
        w = cfg.recip_in_width
        offset_width = max(1, cfg.table_delta_bits)
        kmax = (1 << EXPONENT_WIDTH) - 1
        half = rounding_half(cfg.exp2_shift)
        # Stage 3: EXP2 sums and rounds u = -x log2(e); RECIP slices the normalised z;
        # both give the exponent, the table index and the offset.
        norm = s2["norm"]
        frac = norm[:w - 1]
        rest = frac[:w - 1 - cfg.table_index_bits]
        low = w - 1 - cfg.table_index_bits - cfg.table_delta_bits
        recip_index = frac[w - 1 - cfg.table_index_bits:]
        recip_offset = rest[low:] if low >= 0 else rest << -low
        u_full = Signal(u_width)
        m.d.comb += u_full.eq(csa_sum(m, scaled + ([Const(half, u_width)] if half else []), u_width, "s3_u"))
        u = Signal(len(u_full))
        m.d.comb += u.eq(u_full >> cfg.exp2_shift if cfg.exp2_shift >= 0 else u_full << -cfg.exp2_shift)
        u_int = u[cfg.table_offset_shift:]
        over = u_int[EXPONENT_WIDTH:].any()
        # (EXP's slope is looked up here, a stage early: stage 4 then loads both of stage 5's
        # multiplier operands straight from flip-flops, so synth/absorb.py moves them into the DSP)
        coef = _slope_shape(cfg)
        slopes = Array(Const(v, coef) for v in cfg.exp_slopes_raw)
        s3 = _stage("s3", valid=1, op=2, x=signed(cfg.x_width), interval=cfg.interval_width,
                    exponent=EXPONENT_WIDTH, special=1, index=cfg.table_index_bits, offset=offset_width, slope=coef)
        with m.If(ce):
            m.d.sync += _carry(s3, s2, "valid", "op", "x", "interval")
            if cfg.with_exp:
                m.d.sync += s3["slope"].eq(slopes[s2["interval"]])
            with m.If(s2["op"] == SfmOp.EXP2):
                m.d.sync += [
                    s3["exponent"].eq(Mux(over, kmax, u_int[:EXPONENT_WIDTH])), s3["special"].eq(over),
                    s3["index"].eq(u[cfg.table_delta_bits:cfg.table_offset_shift]),
                    s3["offset"].eq(u[:cfg.table_delta_bits] if cfg.table_delta_bits else 0),
                ]
            with m.Else():
                m.d.sync += [s3["exponent"].eq(s2["lead"]), s3["special"].eq(s2["zero"]),
                             s3["index"].eq(recip_index), s3["offset"].eq(recip_offset)]
        return s3

    def _lookup_stage(self, m, ce, s3):
        """Stage 4: the coefficient look-up (the interval's PWL line, or the table's line)."""
        cfg = self.cfg
        offset_width = max(1, cfg.table_delta_bits)
        coef = _slope_shape(cfg)
        mant = _mantissa_shape(cfg)
        # c0 - round_shift(c1 * offset, k) == (c0' - c1 * offset) >> k (floor) with
        # c0' = (c0 << k) + 2^k - 1 - 2^(k-1): the line's intercept comes pre-shifted with the
        # rounding folded in, so stage 6 is one subtract (not an add, then a subtract)
        k = cfg.table_offset_shift
        fold = (lambda v: (v << k) + (1 << k) - 1 - (1 << (k - 1))) if k > 0 else (lambda v: v)
        c0_shape = _c0_shape(cfg, fold)
        recip_c0 = Array(Const(fold(v), c0_shape) for v in cfg.recip_c0_raw)
        recip_c1 = Array(Const(v, mant) for v in cfg.recip_c1_raw)
        exp2_c0 = Array(Const(fold(v), c0_shape) for v in cfg.exp2_c0_raw)
        exp2_c1 = Array(Const(v, mant) for v in cfg.exp2_c1_raw)
        # EXP's intercept comes as (b << x_frac) + the rounding half of exp_shift, so stage 6
        # has one add: round_shift(a x + (b << x_frac), exp_shift) = (a x + bias) >> exp_shift
        exp_half = rounding_half(cfg.exp_shift)
        bias_raw = [(v << cfg.x_frac) + exp_half for v in cfg.exp_intercepts_raw]
        bias_shape = unsigned(max(1, max(bias_raw).bit_length()))
        biases = Array(Const(v, bias_shape) for v in bias_raw)
        s4 = _stage("s4", valid=1, op=2, x=signed(cfg.x_width), interval=cfg.interval_width,
                    exponent=EXPONENT_WIDTH, special=1, offset=offset_width, slope=coef, intercept=bias_shape,
                    c0=c0_shape, c1=mant)
        is_exp2 = s3["op"] == SfmOp.EXP2
        with m.If(ce):
            m.d.sync += _carry(s4, s3, "valid", "op", "x", "interval", "exponent", "special", "offset", "slope")
            if cfg.with_exp:
                m.d.sync += s4["intercept"].eq(biases[s3["interval"]])
            m.d.sync += [s4["c0"].eq(Mux(is_exp2, exp2_c0[s3["index"]], recip_c0[s3["index"]])),
                         s4["c1"].eq(Mux(is_exp2, exp2_c1[s3["index"]], recip_c1[s3["index"]]))]
        return s4, bias_raw

    def _multiply_stage(self, m, ce, s4):
        """Stage 5: the one multiply (EXP's slope times x in DSP pieces, or c1 times the offset);
        with ``cfg.dsp_registers``, a copy of stage 4 before it and its products registered once more
        (a design whose multipliers fill the device: the free DSP can sit far from the stages around it)."""
        cfg = self.cfg
        offset_width = max(1, cfg.table_delta_bits)
        mant = _mantissa_shape(cfg)
        if cfg.dsp_registers:   # the operands' second register (the DSP's input registers)
            s4 = _copy_stage(m, ce, s4, "s4d")
        s5 = _stage("s5", valid=1, op=2, interval=cfg.interval_width, exponent=EXPONENT_WIDTH, special=1,
                    intercept=len(s4["intercept"]), c0=len(s4["c0"]),
                    line_product=unsigned(mant.width + offset_width))
        carried = ("valid", "op", "interval", "exponent", "special", "intercept", "c0")
        line_product = s4["c1"] * s4["offset"]
        exp_pieces = partial_products(s4["slope"], s4["x"]) if cfg.with_exp else []
        src = s4
        if cfg.dsp_registers:   # the products' first register (the DSP's output register)
            src = {k: s4[k] for k in carried}
            src["line_product"] = line_product
            src = _copy_stage(m, ce, src, "s5d")
            line_product = src["line_product"]
            exp_pieces = register_partials(m, ce, exp_pieces, "s5d_exp")
        with m.If(ce):
            m.d.sync += _carry(s5, src, *carried)
            m.d.sync += s5["line_product"].eq(line_product)
        exp_pieces = register_partials(m, ce, exp_pieces, "s5_exp")
        return s5, exp_pieces

    def _sum_stage(self, m, ce, s5, exp_pieces, bias_raw):
        """Stage 6: EXP's products plus its biased intercept; the table line's subtract."""
        cfg = self.cfg
        k = cfg.table_offset_shift
        # Stage 6: the sums, registered: EXP's products plus its biased intercept (carry-save
        # levels and one carry chain), the table line's subtract. Saturation and the output select
        # are stage 7's, so no stage holds a carry chain and the logic after it (this stage's
        # carry chain, saturation and select were mac-unit's critical path, 14 levels).
        exp_width = exp_sum_width(cfg, bias_raw)
        s6 = _stage("s6", valid=1, op=2, interval=cfg.interval_width, exponent=EXPONENT_WIDTH, special=1,
                    exp_sum=signed(exp_width), mantissa=cfg.value_width)
        exp_sum = (csa_sum(m, placed(exp_pieces) + [s5["intercept"]], exp_width, "s6_exp").as_signed()
                   if cfg.with_exp else Const(0, signed(exp_width)))
        mantissa = ((s5["c0"] - s5["line_product"]) >> k if k > 0
                    else s5["c0"] - round_shift(s5["line_product"], k))
        with m.If(ce):
            m.d.sync += _carry(s6, s5, "valid", "op", "interval", "exponent", "special")
            m.d.sync += [s6["exp_sum"].eq(exp_sum), s6["mantissa"].eq(mantissa)]
        return s6

    def _output_stage(self, m, ce, s6):
        """Stage 7: EXP's rounding shift, saturation and the output select."""
        cfg = self.cfg
        exp_sum = s6["exp_sum"]
        exp_value = saturate(exp_sum >> cfg.exp_shift if cfg.exp_shift > 0 else exp_sum << -cfg.exp_shift,
                             unsigned(cfg.out_width))
        max_mantissa = (1 << (cfg.mantissa_frac + 1)) - 1
        out = self.o.payload
        with m.If(ce):
            m.d.sync += self.o.valid.eq(s6["valid"])
            with m.If((s6["op"] == SfmOp.EXP) if cfg.with_exp else Const(0)):
                m.d.sync += [out.value.eq(exp_value), out.exponent.eq(0), out.interval.eq(s6["interval"])]
            with m.Else():
                m.d.sync += [out.value.eq(s6["mantissa"]), out.interval.eq(0), out.exponent.eq(s6["exponent"])]
                with m.If(s6["special"] & (s6["op"] == SfmOp.RECIP)):
                    m.d.sync += [out.value.eq(max_mantissa), out.exponent.eq(0)]
                with m.If(s6["special"] & (s6["op"] == SfmOp.EXP2)):
                    m.d.sync += out.value.eq(0)
