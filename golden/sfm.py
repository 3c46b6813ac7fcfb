"""Special-function unit (SFM): config, coefficient tables, bit-accurate model, float twins.

Three operations (docs/algorithms.md §1.1, the normalisation ``o = N/Z`` of §1.2, and the
online-softmax merge/removal of §2):

- ``EXP``: piecewise-linear ``exp(x)`` for ``x <= 0`` (``golden.pwl.PwlTable``). The
  input ``x`` is signed ``x_width`` bits with ``x_frac`` fraction bits. The interval
  ``r`` is the number of quantised boundaries ``e_k`` with ``x < e_k``; then
  ``y = sat(round_shift(a_r*x + (b_r << x_frac), coef_frac + x_frac - out_frac))``,
  unsigned ``out_width`` bits with ``out_frac`` fraction bits. Also returns ``r``
  (LAD's mode tracking needs it).
- ``RECIP``: ``1/z`` for an unsigned integer ``z`` as mantissa and exponent,
  ``1/z ~= m * 2**-mantissa_frac * 2**-k``: ``k`` is the leading-one position, the
  normalised ``t = z/2**k`` in ``[1, 2)`` indexes a table of ``2**table_index_bits``
  lines by its top fraction bits, the next ``table_delta_bits`` bits are the offset
  (the bits below are dropped): ``m = c0[j] - round_shift(c1[j]*delta, index+delta bits)``.
  Each line is the chord of ``1/t`` lowered by half its sag (minimax absolute error for
  a convex function). ``z = 0`` returns the largest mantissa and ``k = 0``.
- ``EXP2``: accurate ``exp(x)`` for ``x <= 0`` (MAC's merge weights) as mantissa and
  exponent, ``exp(x) ~= m * 2**-mantissa_frac * 2**-k``: ``u = -x log2(e)`` (one
  multiply by a constant, rounded to ``index+delta`` fraction bits), ``k = floor(u)``,
  and ``2**-frac(u)`` from a second line table of the same shape as RECIP's.
  ``x > 0`` is treated as 0; ``k > 63`` gives ``m = 0``.

RECIP and EXP2 share the line-table datapath (index, offset, ``c0 - c1*offset``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
from amaranth.lib import enum

from .config import BlockConfig, param
from .fixedpoint import FixedFormat, round_shift, saturate
from .pwl import PwlTable


class SfmOp(enum.IntEnum, shape=2):
    """SFM operation (the ``op`` field of an SFM request)."""
    EXP = 0     # PWL exp of x <= 0 with its interval index
    RECIP = 1   # mantissa and exponent of 1/z
    EXP2 = 2    # accurate 2^(x log2 e) as mantissa and exponent


EXPONENT_WIDTH = 6  # RECIP and EXP2 exponents k are 0..63
LOG2E_FRAC = 20    # fraction bits of the constant log2(e) in EXP2


@dataclass(frozen=True)
class SfmConfig(BlockConfig):
    x_width: int = param(16, "EXP: bits of the signed input x")
    x_frac: int = param(10, "EXP: fraction bits of x")
    coef_frac: int = param(16, "EXP: fraction bits of the PWL slopes and intercepts")
    out_width: int = param(16, "EXP: bits of the unsigned output p(x)")
    out_frac: int = param(15, "EXP: fraction bits of p(x)")
    intervals: int = param(8, "EXP: finite PWL intervals over [cutoff, 0] (plus the zero interval)")
    cutoff: float = param(-8.0, "EXP: lower end e_R of the last finite interval; p = 0 below")
    recip_in_width: int = param(32, "RECIP: bits of the unsigned input z")
    table_index_bits: int = param(7, "RECIP/EXP2: top fraction bits that index the line tables")
    table_delta_bits: int = param(10, "RECIP/EXP2: next fraction bits, the offset within a line")
    mantissa_frac: int = param(16, "RECIP/EXP2: fraction bits of the output mantissa (in (0.5, 1])")
    dsp_registers: bool = param(False, "RTL: the multiply's operands and products registered twice "
                                       "(latency 9, not 7; the same results)")
    stall_free: bool = param(False, "RTL: no clock enable (i and o always ready): its user takes every "
                                    "result the cycle it is valid (the same results and latency)")
    with_exp: bool = param(True, "RTL: build EXP (the boundary compares, PWL tables and its multiply); "
                                 "False for a user of RECIP and EXP2 alone (the MAC blocks, which send no "
                                 "EXP request: its result is then not defined)")

    def validate(self):
        self.require(4 <= self.x_width <= 24, f"x_width must be 4..24, got {self.x_width}")
        self.require(0 <= self.x_frac < self.x_width, f"x_frac must be 0..x_width-1, got {self.x_frac}")
        self.require(4 <= self.coef_frac <= 24, f"coef_frac must be 4..24, got {self.coef_frac}")
        self.require(2 <= self.out_width <= 24, f"out_width must be 2..24, got {self.out_width}")
        self.require(0 <= self.out_frac <= self.coef_frac + self.x_frac,
                     f"out_frac must be 0..coef_frac+x_frac, got {self.out_frac}")
        self.require(self.out_frac < self.out_width + 1,
                     f"out_frac ({self.out_frac}) must be at most out_width ({self.out_width})")
        self.require(1 <= self.intervals <= 32, f"intervals must be 1..32, got {self.intervals}")
        x_min = -(2 ** (self.x_width - 1 - self.x_frac))
        self.require(x_min <= self.cutoff < 0,
                     f"cutoff must be in [{x_min}, 0) (the range of x), got {self.cutoff}")
        self.require(-self.cutoff / self.intervals >= 2.0 ** -self.x_frac,
                     "intervals narrower than one LSB of x: raise x_frac or lower intervals")
        self.require(2 <= self.recip_in_width <= 48,
                     f"recip_in_width must be 2..48, got {self.recip_in_width}")
        self.require(1 <= self.table_index_bits <= min(10, self.recip_in_width - 1),
                     f"table_index_bits must be 1..{min(10, self.recip_in_width - 1)}, got {self.table_index_bits}")
        self.require(0 <= self.table_delta_bits <= 20,
                     f"table_delta_bits must be 0..20, got {self.table_delta_bits}")
        self.require(8 <= self.mantissa_frac <= 24, f"mantissa_frac must be 8..24, got {self.mantissa_frac}")

    # -- formats -------------------------------------------------------------------
    @property
    def x_format(self) -> FixedFormat:
        return FixedFormat(self.x_width, self.x_frac)

    @property
    def coef_format(self) -> FixedFormat:
        return FixedFormat(self.coef_frac + 1, self.coef_frac, signed=False)

    @property
    def out_format(self) -> FixedFormat:
        return FixedFormat(self.out_width, self.out_frac, signed=False)

    @property
    def mantissa_format(self) -> FixedFormat:
        return FixedFormat(self.mantissa_frac + 1, self.mantissa_frac, signed=False)

    @property
    def exp_shift(self) -> int:
        return self.coef_frac + self.x_frac - self.out_frac

    @property
    def value_width(self) -> int:
        """Bits of the shared output value field (EXP result or RECIP mantissa)."""
        return max(self.out_width, self.mantissa_frac + 1)

    @property
    def exponent_width(self) -> int:
        return EXPONENT_WIDTH

    @property
    def interval_width(self) -> int:
        return max(1, self.intervals.bit_length())

    # -- tables (computed once per config) -----------------------------------------
    @cached_property
    def pwl(self) -> PwlTable:
        return PwlTable(self.intervals, self.cutoff)

    @cached_property
    def exp_boundaries_raw(self) -> list[int]:
        return [int(self.x_format.quantize(e)) for e in self.pwl.boundaries]

    @cached_property
    def exp_slopes_raw(self) -> list[int]:
        return [int(self.coef_format.quantize(a)) for a in self.pwl.slopes]

    @cached_property
    def exp_intercepts_raw(self) -> list[int]:
        return [int(self.coef_format.quantize(b)) for b in self.pwl.intercepts]

    @property
    def table_offset_shift(self) -> int:
        return self.table_index_bits + self.table_delta_bits

    def _lines(self, func, lo: float) -> tuple[list[int], list[int]]:
        """Line table of a decreasing convex ``func`` on ``[lo, lo + 1)``: chord lowered by
        half its sag; ``func(t) ~= c0[j] - c1[j] * (t - t_j)``."""
        c0s, c1s = [], []
        step = 2.0 ** -self.table_index_bits
        for j in range(2 ** self.table_index_bits):
            t0, t1 = lo + j * step, lo + (j + 1) * step
            slope = (func(t0) - func(t1)) / step
            grid = [t0 + step * i / 64 for i in range(65)]
            sag = max((func(t0) - slope * (t - t0)) - func(t) for t in grid)
            c0s.append(int(self.mantissa_format.quantize(func(t0) - sag / 2)))
            c1s.append(int(self.mantissa_format.quantize(slope)))
        return c0s, c1s

    @cached_property
    def _recip_lines(self) -> tuple[list[int], list[int]]:
        return self._lines(lambda t: 1.0 / t, 1.0)

    @cached_property
    def _exp2_lines(self) -> tuple[list[int], list[int]]:
        return self._lines(lambda f: 2.0 ** -f, 0.0)

    @property
    def recip_c0_raw(self) -> list[int]:
        return self._recip_lines[0]

    @property
    def recip_c1_raw(self) -> list[int]:
        return self._recip_lines[1]

    @property
    def exp2_c0_raw(self) -> list[int]:
        return self._exp2_lines[0]

    @property
    def exp2_c1_raw(self) -> list[int]:
        return self._exp2_lines[1]

    @property
    def log2e_raw(self) -> int:
        return round(math.log2(math.e) * 2 ** LOG2E_FRAC)

    @property
    def exp2_shift(self) -> int:
        """Right shift taking ``-x * log2e_raw`` to ``u`` with ``index+delta`` fraction bits."""
        return self.x_frac + LOG2E_FRAC - self.table_offset_shift


PRESETS = {
    "default": SfmConfig(),
    "lad16": SfmConfig(intervals=16, cutoff=-10.0, x_width=18, x_frac=11),
    # scores to +-128: EXP2 clamps |x| at 2^14 raw (44.4 and up give exponent 63), below x's own
    # range, so its clamp from below is built (at the others the clamp is x's range)
    "wide_x": SfmConfig(x_width=16, x_frac=8),
    "dsp_registers": SfmConfig(dsp_registers=True),
    "stall_free": SfmConfig(stall_free=True),
    # the MAC blocks' SFMs (RECIP and EXP2 alone): mac-decode's, and its MergeUnit's
    "mac_decode": SfmConfig(dsp_registers=True, with_exp=False),
    "mac_merge": SfmConfig(stall_free=True, with_exp=False),
    "small": SfmConfig(x_width=12, x_frac=7, coef_frac=12, out_width=12, out_frac=11, intervals=4,
                       cutoff=-6.0, recip_in_width=20, table_index_bits=5, table_delta_bits=6,
                       mantissa_frac=12),
}


# -- bit-accurate model ----------------------------------------------------------------
def exp_interval(x_raw: torch.Tensor, cfg: SfmConfig) -> torch.Tensor:
    e = torch.tensor(cfg.exp_boundaries_raw, dtype=torch.int64)
    return (x_raw.unsqueeze(-1) < e).sum(-1)


def exp_pwl(x_raw: torch.Tensor, cfg: SfmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit-accurate EXP: raw p(x) (``out_format``) and the interval index of each raw x."""
    x_raw = torch.as_tensor(x_raw, dtype=torch.int64)
    r = exp_interval(x_raw, cfg)
    a = torch.tensor(cfg.exp_slopes_raw, dtype=torch.int64)[r]
    b = torch.tensor(cfg.exp_intercepts_raw, dtype=torch.int64)[r]
    y = round_shift(a * x_raw + (b << cfg.x_frac), cfg.exp_shift)
    return saturate(y, cfg.out_format), r


def leading_one(z: torch.Tensor) -> torch.Tensor:
    """Position of the highest set bit (0 for z = 0)."""
    pow2 = torch.tensor([1 << i for i in range(63)], dtype=torch.int64)
    return ((z.unsqueeze(-1) >= pow2).sum(-1) - 1).clamp(min=0)


def recip(z_raw: torch.Tensor, cfg: SfmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit-accurate RECIP: mantissa (``mantissa_format``) and exponent with 1/z ~= m*2^-frac*2^-k."""
    z = torch.as_tensor(z_raw, dtype=torch.int64)
    w, i_bits, d_bits = cfg.recip_in_width, cfg.table_index_bits, cfg.table_delta_bits
    k = leading_one(z)
    norm = z << (w - 1 - k)
    frac = norm & ((1 << (w - 1)) - 1)
    j = frac >> (w - 1 - i_bits)
    rest = frac & ((1 << (w - 1 - i_bits)) - 1)
    low = w - 1 - i_bits - d_bits
    delta = rest >> low if low >= 0 else rest << -low
    m = _line(j, delta, cfg.recip_c0_raw, cfg.recip_c1_raw, cfg)
    m = torch.where(z == 0, torch.full_like(m, cfg.mantissa_format.max_raw), m)
    return m, torch.where(z == 0, torch.zeros_like(k), k)


def _line(j, delta, c0_table, c1_table, cfg):
    c0 = torch.tensor(c0_table, dtype=torch.int64)[j]
    c1 = torch.tensor(c1_table, dtype=torch.int64)[j]
    return c0 - round_shift(c1 * delta, cfg.table_offset_shift)


def exp2(x_raw: torch.Tensor, cfg: SfmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit-accurate EXP2: mantissa and exponent with exp(x) ~= m * 2^-frac * 2^-k (x > 0 -> x = 0)."""
    x = torch.as_tensor(x_raw, dtype=torch.int64)
    neg_x = torch.clamp(-x, min=0)
    u = round_shift(neg_x * cfg.log2e_raw, cfg.exp2_shift)
    k = u >> cfg.table_offset_shift
    j = (u >> cfg.table_delta_bits) & ((1 << cfg.table_index_bits) - 1)
    delta = u & ((1 << cfg.table_delta_bits) - 1)
    m = _line(j, delta, cfg.exp2_c0_raw, cfg.exp2_c1_raw, cfg)
    kmax = (1 << EXPONENT_WIDTH) - 1
    m = torch.where(k > kmax, torch.zeros_like(m), m)
    return m, torch.clamp(k, max=kmax)


# -- float twins --------------------------------------------------------------------------
def exp_pwl_float(x: torch.Tensor, cfg: SfmConfig) -> torch.Tensor:
    return cfg.pwl.exp(x)


def mantissa_value(m: torch.Tensor, k: torch.Tensor, cfg: SfmConfig) -> torch.Tensor:
    """Real value of a RECIP or EXP2 result ``m * 2^-frac * 2^-k``."""
    return m.double() * 2.0 ** -cfg.mantissa_frac * torch.pow(2.0, -k.double())


def exp_bound(x: torch.Tensor, cfg: SfmConfig) -> torch.Tensor:
    """Bound on |bit-accurate EXP - float PWL| for exactly representable x (no saturation):
    coefficient quantisation ``(|x| + 1) * coef_lsb/2`` plus output rounding ``out_lsb/2``."""
    return (x.abs() + 1.0) * 2.0 ** -(cfg.coef_frac + 1) + 2.0 ** -(cfg.out_frac + 1)


def exp2_relative_bound(x: torch.Tensor, cfg: SfmConfig) -> torch.Tensor:
    """Bound on |EXP2/exp(x) - 1| for x <= 0 (while k <= 63): line sag and rounding of the
    table (as RECIP's, relative to the smallest result 0.5), plus the rounding of u
    (half an LSB of its fraction) and of the constant log2(e), times ln 2."""
    u_err = 2.0 ** -(cfg.table_offset_shift + 1) + x.abs() * 2.0 ** -(LOG2E_FRAC + 1)
    return recip_relative_bound(cfg) + u_err * math.log(2) * 1.01


def recip_relative_bound(cfg: SfmConfig) -> float:
    """Bound on |RECIP/(1/z) - 1|: half the worst line sag, coefficient and offset rounding,
    the dropped offset bits, and output rounding, relative to the smallest result 0.5."""
    step = 2.0 ** -cfg.table_index_bits
    sag = (1.0 - (1.0 / (1.0 * (1.0 + step))) * (math.sqrt(1.0 + step) - 1.0)) - 1.0 / math.sqrt(1.0 + step)
    lsb = 2.0 ** -cfg.mantissa_frac
    dropped = 2.0 ** -(cfg.table_index_bits + cfg.table_delta_bits)
    return (sag / 2 + 2.5 * lsb + dropped) / 0.5
