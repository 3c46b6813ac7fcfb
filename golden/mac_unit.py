"""MAC unit (docs/algorithms.md §2): config and bit-accurate models of its two RTL blocks.

**Match** — per query head a ring window of the last ``window`` pre-RoPE queries
(slot = position mod window). A new query ``q`` (signed ``q_width`` bits, ``q_frac``
fraction bits) is compared with every valid slot by the squared L2 distance, computed
exactly by the VPU's SQDIST; the best is the minimum, ties to the lower position; it
is a hit iff ``dist_raw < threshold_raw = ceil(2 d (1 - tau)^2 * 2^(2 q_frac))``, i.e.
exactly ``||q - q_m||^2 < 2d(1 - tau)^2`` on the quantised queries. Then ``q`` is
inserted into the ring.

**Merge** — attention states are kept as ``(m, s, o)``: a reference score ``m``
(natural-log domain, ``score_frac`` fraction bits), ``s = sum_i exp(score_i - m)``
(unsigned, ``sum_frac``) and the normalised output ``o`` (``d`` values, ``out_frac``),
so ``lse = m + ln s``. Merge (⊕) and removal (⊖, the downdate) of state 2 from 1:
``m = max(m1, m2)``; the state with the smaller ``m`` has its ``s`` scaled by
``exp(-|m1 - m2|)`` (SFM EXP2: exp of a non-positive difference only; exactly 1 when
``m1 = m2``), giving ``a``
(state 1) and ``b`` (state 2); ``s = a ± b``; ``w1 = a/s``, ``w2 = ±b/s`` (SFM RECIP);
``o = sat(round_shift(w1 o1 + w2 o2, mantissa_frac))``. The result is *flagged*
(``s = 0``, ``o = 0``) when ``s <= 0`` or, for ⊖, when ``1 - t = s/a < 2^-cancel_bits``
(catastrophic cancellation: the caller must recompute in full).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
from amaranth.lib import enum

from .config import BlockConfig, param
from .fixedpoint import FixedFormat, round_shift, saturate
from .mac_ref import MacConfig
from .sfm import SfmConfig, exp2, recip
from .vpu import VpuConfig

class MergeOp(enum.IntEnum, shape=1):
    """Operation of the merge unit: ⊕ of two attention states, or ⊖ (state 2 removed from state 1)."""
    MERGE = 0
    DOWNDATE = 1


@dataclass(frozen=True)
class MacUnitConfig(BlockConfig):
    window: int = param(512, "M: ring window of past pre-RoPE queries per query head")
    head_dim: int = param(64, "d: head dimension")
    heads: int = param(3, "query heads served (each has its own ring)")
    lanes: int = param(8, "VPU lanes: elements per beat (d must be a multiple)")
    q_width: int = param(16, "bits of a signed pre-RoPE query element")
    q_frac: int = param(8, "fraction bits of a query element")
    tau: float = param(0.45, "match threshold: hit iff ||q - q_m|| < sqrt(2d)(1 - tau)")
    score_width: int = param(24, "bits of the signed reference score m of a state")
    score_frac: int = param(12, "fraction bits of m")
    sum_width: int = param(40, "bits of the unsigned softmax sum s of a state")
    sum_frac: int = param(20, "fraction bits of s")
    out_width: int = param(20, "bits of a signed output element o")
    out_frac: int = param(12, "fraction bits of o")
    cancel_bits: int = param(6, "removal is flagged when 1 - t < 2^-cancel_bits")
    mantissa_frac: int = param(16, "fraction bits of the SFM's EXP2/RECIP mantissas and the weights")

    def validate(self):
        self.require(2 <= self.window <= 1 << 16, f"window must be 2..65536, got {self.window}")
        self.require(1 <= self.lanes <= 64, f"lanes must be 1..64, got {self.lanes}")
        self.require(self.head_dim >= 1 and self.head_dim % self.lanes == 0,
                     f"head_dim ({self.head_dim}) must be a positive multiple of lanes ({self.lanes})")
        self.require(1 <= self.heads <= 64, f"heads must be 1..64, got {self.heads}")
        self.require(self.ring_words <= 1 << 22,
                     f"ring of heads*window*head_dim/lanes = {self.ring_words} words is too deep (max 2^22)")
        self.require(4 <= self.q_width <= 20, f"q_width must be 4..20, got {self.q_width}")
        self.require(0 <= self.q_frac < self.q_width, f"q_frac must be 0..q_width-1, got {self.q_frac}")
        self.require(0.0 < self.tau < 1.0, f"tau must be in (0, 1), got {self.tau}")
        self.require(8 <= self.score_width <= 24, f"score_width must be 8..24 (the SFM's x format), got {self.score_width}")
        self.require(0 <= self.score_frac < self.score_width - 4,
                     f"score_frac must leave at least 4 integer bits, got {self.score_frac}")
        self.require(8 <= self.sum_width <= 44, f"sum_width must be 8..44, got {self.sum_width}")
        self.require(0 <= self.sum_frac < self.sum_width, f"sum_frac must be 0..sum_width-1, got {self.sum_frac}")
        self.require(4 <= self.out_width <= 24, f"out_width must be 4..24, got {self.out_width}")
        self.require(0 <= self.out_frac < self.out_width, f"out_frac must be 0..out_width-1, got {self.out_frac}")
        self.require(1 <= self.cancel_bits <= 12, f"cancel_bits must be 1..12, got {self.cancel_bits}")
        self.require(8 <= self.mantissa_frac <= 20, f"mantissa_frac must be 8..20, got {self.mantissa_frac}")
        self.sfm, self.vpu   # the derived configs validate themselves: their errors surface here, not at build

    # -- derived -----------------------------------------------------------------------
    @property
    def beats(self) -> int:
        """Beats of one d-vector."""
        return self.head_dim // self.lanes

    @property
    def ring_words(self) -> int:
        return self.heads * self.window * self.beats

    @property
    def q_format(self) -> FixedFormat:
        return FixedFormat(self.q_width, self.q_frac)

    @property
    def score_format(self) -> FixedFormat:
        return FixedFormat(self.score_width, self.score_frac)

    @property
    def sum_format(self) -> FixedFormat:
        return FixedFormat(self.sum_width, self.sum_frac, signed=False)

    @property
    def out_format(self) -> FixedFormat:
        return FixedFormat(self.out_width, self.out_frac)

    @property
    def weight_width(self) -> int:
        return self.mantissa_frac + self.cancel_bits + 3

    @property
    def position_width(self) -> int:
        return 32

    @property
    def threshold_raw(self) -> int:
        """Squared-distance threshold in raw units: hit iff dist_raw < threshold_raw."""
        return math.ceil(2 * self.head_dim * (1 - self.tau) ** 2 * 2 ** (2 * self.q_frac))

    @cached_property
    def vpu(self) -> VpuConfig:
        acc = 2 * (self.q_width + 1) + max(1, (self.head_dim - 1).bit_length()) + 1
        return VpuConfig(lanes=self.lanes, in_width=self.q_width, acc_width=max(acc, 2 * self.q_width + 2),
                         axpy_shift=0)

    @cached_property
    def sfm(self) -> SfmConfig:
        return SfmConfig(x_width=self.score_width, x_frac=self.score_frac, recip_in_width=self.sum_width,
                         mantissa_frac=self.mantissa_frac, with_exp=False)   # the unit uses RECIP and EXP2 alone

    def reference(self) -> MacConfig:
        """The float reference (golden.mac_ref.MacConfig) of this unit: same window, match threshold
        tau and cancellation bound 2^-cancel_bits; band, sinks and min_context are the decoder's
        (MacConfig's defaults)."""
        return MacConfig(window=self.window, tau=self.tau, cancel_bound=2.0 ** -self.cancel_bits)


PRESETS = {
    "default": MacUnitConfig(),
    "tiny": MacUnitConfig(window=8, head_dim=8, heads=2, lanes=4),
    "smollm2-group": MacUnitConfig(window=512, head_dim=64, heads=3, lanes=16),
}


# -- Match ------------------------------------------------------------------------------
@dataclass
class MatchResult:
    hit: bool
    slot: int
    position: int
    distance: int  # raw squared distance (max accumulator value when the window is empty)


class MatchModel:
    """Bit-accurate Match: ring windows per head, query -> best earlier query, then insert."""

    def __init__(self, cfg: MacUnitConfig):
        self.cfg = cfg
        self.ring = torch.zeros(cfg.heads, cfg.window, cfg.head_dim, dtype=torch.int64)
        self.count = [0] * cfg.heads

    def query(self, head: int, q_raw: torch.Tensor) -> MatchResult:
        cfg = self.cfg
        n = self.count[head]
        valid = min(n, cfg.window)
        positions = torch.arange(n - valid, n)
        slots = positions % cfg.window
        if valid:
            dist = ((self.ring[head, slots] - q_raw) ** 2).sum(-1)  # exact: acc_width cannot saturate
            k = int(torch.argmin(dist))  # first minimum = lowest position
            result = MatchResult(int(dist[k]) < cfg.threshold_raw, int(slots[k]), int(positions[k]), int(dist[k]))
        else:
            result = MatchResult(False, 0, 0, cfg.vpu.acc_format.max_raw)
        self.ring[head, n % cfg.window] = q_raw
        self.count[head] = n + 1
        return result


# -- Merge ------------------------------------------------------------------------------
@dataclass
class MergeResult:
    m: int
    s: int
    o: list[int]
    flagged: bool


def merge_bits(op: int, m1: int, s1: int, o1: torch.Tensor, m2: int, s2: int, o2: torch.Tensor,
               cfg: MacUnitConfig) -> MergeResult:
    """Bit-accurate ⊕ (``MergeOp.MERGE``) or ⊖ (``MergeOp.DOWNDATE``, state 2 removed from state 1)."""
    sfm, frac = cfg.sfm, cfg.mantissa_frac
    diff = m1 - m2
    first_is_max = diff >= 0
    m = m1 if first_is_max else m2
    x = max(-abs(diff), sfm.x_format.min_raw)
    me, ke = (int(v) for v in exp2(torch.tensor([x]), sfm))
    small = s2 if first_is_max else s1
    scaled = small if x == 0 else round_shift(small * me, frac + ke)  # exp(0) = 1 exactly
    a, b = (s1, scaled) if first_is_max else (scaled, s2)
    s_full = a + b if op == MergeOp.MERGE else a - b
    flagged = s_full <= 0 or (op == MergeOp.DOWNDATE and (s_full << cfg.cancel_bits) < a)
    if flagged:
        return MergeResult(m, 0, [0] * len(o1), True)
    s = saturate(s_full, cfg.sum_format)
    r, kr = (int(v) for v in recip(torch.tensor([s]), sfm))
    w1 = round_shift(a * r, kr)
    w2 = round_shift(b * r, kr)
    if op == MergeOp.DOWNDATE:
        w2 = -w2
    o = saturate(round_shift(w1 * o1 + w2 * o2, frac), cfg.out_format)
    return MergeResult(m, s, [int(v) for v in o], False)


# -- conversions between float (o, lse) states and raw (m, s, o) ----------------------------
def state_to_raw(m: float, s: float, o: torch.Tensor, cfg: MacUnitConfig) -> tuple[int, int, torch.Tensor]:
    return (int(cfg.score_format.quantize(m)), int(cfg.sum_format.quantize(s)), cfg.out_format.quantize(o))


def raw_to_lse(m_raw: int, s_raw: int, cfg: MacUnitConfig) -> float:
    return cfg.score_format.to_float(m_raw).item() + math.log(cfg.sum_format.to_float(s_raw).item())
