"""Dense PWL attention baseline (the LAD tile's reference point, docs/algorithms.md §1.1):
config, bit-accurate model and float twin.

One head, one decode step over positions ``0..n-1`` of the KV cache, with LAD's
piecewise-linear exp but no reuse: every key and value is read.

- exact scores ``s_i = round_shift(q·k_i * scale, ...)`` in the SFM's x format, with
  ``scale = round(2^16 / sqrt(d))`` (exact 2^13 for d = 64);
- ``m = max_i s_i``; ``x_i = sat(s_i - m)``; ``p_i`` = SFM EXP (PWL) of ``x_i``;
- ``Z = sum p_i``, ``N_l = sum p_i v_il`` (exact integers);
- ``o_l = sat(round_shift(N_l * r, mantissa_frac + k))`` with ``(r, k)`` = SFM RECIP of ``Z``.
q, k, v and o share one format (``kv_width``, ``kv_frac``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import torch

from .config import BlockConfig, param
from .fixedpoint import FixedFormat, round_shift, saturate
from .sfm import SfmConfig, exp_pwl, recip
from .vpu import PIPELINE_LATENCY, VpuConfig

SCALE_FRAC = 16


@dataclass(frozen=True)
class HeadConfig(BlockConfig):
    """What every one-head attention block shares (the dense baseline and the LAD tile): the head's
    shape, the q/k/v/o number format, the context it holds and the PWL exp. Subclasses add their
    own parameters and checks; ``sfm`` is theirs (its reciprocal width depends on the block)."""
    head_dim: int = param(64, "d: head dimension")
    lanes: int = param(8, "VPU lanes: one beat carries this many elements of q, k, v, o")
    kv_width: int = param(16, "bits of a signed q, k, v or o element")
    kv_frac: int = param(8, "fraction bits of q, k, v and o")
    max_positions: int = param(4096, "largest context the block holds")
    intervals: int = param(8, "R: finite PWL intervals over [cutoff, 0] (plus the zero interval)")
    cutoff: float = param(-8.0, "e_R: below this x = s - m contributes nothing")
    score_width: int = param(18, "bits of a signed score s, the running max m and x = s - m (the SFM's x)")
    score_frac: int = param(9, "fraction bits of s, m and x")
    group: int = param(1, "query heads one block serves (a KV group), in lockstep on one stream of the "
                          "group's keys and values, each read once for the group (LAD tile: one center "
                          "table, its reciprocals and each position's center and rho serve them all)")

    min_beats = 2   # head_dim / lanes at least this

    def validate(self):
        self.require(1 <= self.lanes <= 64, f"lanes must be 1..64, got {self.lanes}")
        self.require(self.head_dim % self.lanes == 0 and self.head_dim // self.lanes >= self.min_beats,
                     f"head_dim ({self.head_dim}) must be a multiple of lanes ({self.lanes}) with at least "
                     f"{self.min_beats} beats per vector")
        self.require(2 <= self.max_positions <= 1 << 16, f"max_positions must be 2..65536, got {self.max_positions}")
        self.require(1 <= self.group <= 16, f"group must be 1..16 query heads, got {self.group}")
        self.require(8 <= self.score_width <= 24 and 4 <= self.score_frac <= self.score_width - 6,
                     f"score_width must be 8..24 and score_frac 4..score_width-6, got {self.score_width}.{self.score_frac}")

    @property
    def beats(self) -> int:
        return self.head_dim // self.lanes

    @property
    def kv_format(self) -> FixedFormat:
        return FixedFormat(self.kv_width, self.kv_frac)

    @property
    def position_width(self) -> int:
        return max(1, self.max_positions.bit_length())

    @property
    def scale_raw(self) -> int:
        """1/sqrt(d) as a raw constant with SCALE_FRAC fraction bits."""
        return round(2 ** SCALE_FRAC / math.sqrt(self.head_dim))

    @property
    def score_shift(self) -> int:
        """Right shift from dot * scale (frac 2*kv_frac + 16) to the SFM's x format."""
        return 2 * self.kv_frac + SCALE_FRAC - self.sfm.x_frac

    def head_fields(self) -> dict:
        """This config's HeadConfig fields (to derive another head block's config from it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(HeadConfig)}


@dataclass(frozen=True)
class DenseConfig(HeadConfig):
    min_beats = 4   # the score buffer's pipeline needs four beats per vector

    def validate(self):
        super().validate()
        self.require(4 <= self.kv_width <= 20, f"kv_width must be 4..20, got {self.kv_width}")
        self.require(0 <= self.kv_frac < self.kv_width, f"kv_frac must be 0..kv_width-1, got {self.kv_frac}")
        self.sfm  # validates the PWL parameters

    @cached_property
    def sfm(self) -> SfmConfig:
        return SfmConfig(intervals=self.intervals, cutoff=self.cutoff, x_width=self.score_width,
                         x_frac=self.score_frac, recip_in_width=self.sfm_out_width_sum)

    @property
    def sfm_out_width_sum(self) -> int:
        """Bits of Z = sum of up to max_positions PWL values."""
        return 16 + self.position_width

    @property
    def out_shift_max(self) -> int:
        """Largest shift of the output ``round_shift(N r, mantissa_frac + k)``: ``k`` is the leading one of Z."""
        return self.sfm.mantissa_frac + self.sfm_out_width_sum - 1

    @property
    def out_sum_width(self) -> int:
        """Signed bits of ``N r + 2^(s-1)`` (s = mantissa_frac + k), the output's sum before its shift.
        ``N = sum p v`` and ``Z = sum p`` (p >= 0, ``|v| <= 2^(kv_width-1)``), so ``|N| <= Z 2^(kv_width-1)``;
        RECIP's ``r = 2^s (1 + e) / Z`` with ``|e| <= recip_relative_bound`` (1e-4), so
        ``|N r| <= 2^(s + kv_width - 1) (1 + e)`` and ``|N r + 2^(s-1)| < 2^(s + kv_width)``.
        Checked at every Z (test_dense_output_sum_fits_its_width)."""
        return self.out_shift_max + self.kv_width + 1

    @cached_property
    def vpu(self) -> VpuConfig:
        """One VPU does both the score DOT (q, k) and the AXPY N += p v (scalar p up to 17 bits)."""
        width = max(self.kv_width, 17)
        acc = max(2 * width + 2 + max(1, (self.head_dim - 1).bit_length()), 17 + self.kv_width + self.position_width + 1)
        return VpuConfig(lanes=self.lanes, in_width=width, acc_width=acc, axpy_shift=0)


PRESETS = {
    "default": DenseConfig(),
    "small": DenseConfig(head_dim=32, lanes=8, max_positions=256),
    "group3": DenseConfig(group=3),   # the group-aware block: SmolLM2's 3 query heads of a KV head
}

# -- the RTL's schedule (hdl.lad.dense), checked cycle-exactly by test_dense_rtl_cycles_equal_schedule
STEP_FILL = 38   # cycles a step adds to its beats when nothing stalls (one-cycle KV memory): the fills of
#                  the key pass (KV round trip, VPU, three score stages), the value pass (score SRAM, x
#                  register, SFM EXP, p FIFO, VPU) and RECIP (SFM); measured on the RTL


def dense_step_cycles(cfg: HeadConfig, n: int) -> int:
    """Cycles of one step over ``n`` positions with nothing stalling (the ``cycles`` the RTL reports):
    a key beat a cycle; a position's value beats ``max(beats, VPU latency + 1)`` cycles apart, as
    its AXPY reads each beat of N only after the previous position's update of it is written back
    (at most ``beats`` in the VPU), the last position's ``beats``; and the pipelines' fill.

    ``cfg.group`` g > 1: the group-aware dense block (hdl.lad.dense.DenseAttention at that group),
    the baseline of a LAD tile per KV group: the g query heads of one KV head in lockstep, g VPUs
    taking each key and value beat once, read once for the group (the same KV bandwidth); its first
    head starts g - 1 queries' beats before the last, whose loads the step waits for."""
    nb = cfg.beats
    return n * nb + (n - 1) * max(nb, PIPELINE_LATENCY + 1) + nb + STEP_FILL + (cfg.group - 1) * nb


def score_raw(q: torch.Tensor, k: torch.Tensor, cfg: DenseConfig) -> torch.Tensor:
    """Exact scaled scores of raw q (d,) against raw keys (n, d), in the SFM's x format."""
    return score_from_dots((k * q).sum(-1), cfg)  # the VPU's DOT, exact: its accumulator is sized not to saturate


def score_from_dots(dots: torch.Tensor, cfg: HeadConfig) -> torch.Tensor:
    """Scores of exact dot products ``q.k``: scaled by ``scale_raw``, rounded, in the SFM's x format."""
    return saturate(round_shift(dots * cfg.scale_raw, cfg.score_shift), cfg.sfm.x_format)


def dense_weights(q: torch.Tensor, k: torch.Tensor, cfg: DenseConfig):
    """The step's PWL weights: raw ``p`` (n,), ``m`` and ``Z`` (ints)."""
    s = score_raw(q, k, cfg)
    m = int(s.max())
    p, _ = exp_pwl(saturate(s - m, cfg.sfm.x_format), cfg.sfm)
    return p, m, int(p.sum())


def dense_normalise(n: torch.Tensor, z: int, cfg: DenseConfig) -> torch.Tensor:
    """``o = sat(round_shift(N * r, mantissa_frac + k))`` with ``(r, k)`` = SFM RECIP of ``Z``."""
    r, kk = (int(t) for t in recip(torch.tensor([z]), cfg.sfm))
    return saturate(round_shift(n * r, cfg.sfm.mantissa_frac + kk), cfg.kv_format)


def dense_attention_bits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: DenseConfig):
    """Bit-accurate dense PWL attention: raw o (d,) and (m, Z) for one step."""
    p, m, z = dense_weights(q, k, cfg)
    return dense_normalise((p[:, None] * v).sum(0), z, cfg), m, z


def dense_attention_float(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: DenseConfig,
                          exact_exp: bool = False) -> torch.Tensor:
    """Float twin (PWL exp, or exact exp = ordinary softmax attention) on real-valued q, k, v."""
    s = (k.double() @ q.double()) / math.sqrt(cfg.head_dim)
    x = s - s.max()
    p = torch.exp(x) if exact_exp else cfg.sfm.pwl.exp(x)
    return (p[:, None] * v.double()).sum(0) / p.sum()
