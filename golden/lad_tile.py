"""LAD tile: config and bit-accurate model of one head's decode steps (docs/algorithms.md §1).

Mirrors the float reference ``golden.lad_ref.LadHead`` step for step, with the integer
formats of docs/lad-tile.md; ``LadTileConfig.reference()`` is the float twin's config.
Every rounding is ``round_shift``, every clamp ``saturate`` (golden/fixedpoint.py); the
RTL (hdl/lad/) does exactly this. Raw formats (``real = raw * 2**-frac``):

- q, k, v, o: ``kv_format`` (s16.8); scores ``s``, ``s^``, ``m``, ``x``: the SFM's x format
  (``score_width``.``score_frac``, s18.9 at the defaults); PWL values ``p`` and correction weights ``w``: frac 15 (the SFM's EXP output);
  coefficients ``a, b`` and ``alpha, beta``: frac 16; rho: ``rho_format`` (s20.12).
- Caches (exact integers, saturating): ``A[l][j] = sum g_l k_j`` with
  ``g_l = round_shift(alpha v_l, 8)`` (frac 24), ``B = sum alpha v``, ``C = sum beta v``,
  ``D = sum alpha k`` (frac 24), ``E = sum alpha``, ``F = sum beta`` (frac 16).
- ``N`` (frac 23) and ``Z`` (frac 15), as in the dense baseline, so ``o = N * RECIP(Z)``
  is the same rounding.

One step at position ``n`` (eq. numbers are docs/algorithms.md sections):

1. EAS (§1.4): ``qcs_j = score(q, c_j)`` for every center; for ``k_n``:
   ``t_j = round_shift(dot_j**2 * rc_j, mf + e_j)`` ≈ ``cos_j**2 |k|**2`` with
   ``(rc_j, e_j) = RECIP(|c_j|**2)``; best ``j`` = first argmax; join iff
   ``t_j * 2**16 >= cos2 * |k|**2`` and ``|k|**2 > 0`` (or the table is full);
   ``rho = sat(round_shift(dot_j * rc_j, mf + e_j - rho_frac))`` (projection ``k.c/|c|**2``);
   otherwise ``k_n`` becomes center ``C`` with ``rho = 1``.
2. ``s^_i = sat(round_shift(qcs_{j(i)} * rho_i, rho_frac))``; ``s_n = score(q, k_n)``;
   ``m = max(max_i s^_i, s_n)``.
3. AC cache terms (§1.2, before this step's mode changes):
   ``N_l = round_shift(S * q.A_r[l], 13) - round_shift(m B_l, 11) + round_shift(C_l, 1)``,
   ``Z = round_shift(S * q.D_r, 21) - round_shift(m E, 11) + round_shift(F, 1)`` with
   ``A_r, D_r = sat(round_shift(., 24 - cache_dot_frac))`` (the AC VPUs' operand width).
4. APID (§1.4): ``x^_i = sat(s^_i - m)``; candidate iff ``x^_i`` is outside its mode
   interval (widened by the guard); the others bump their mode counter.
5. MD (§1.3-1.4), candidates in position order: ``x_i = sat(score(q, k_i) - m)``,
   ``r_i`` its interval; false alarm if ``r_i`` is the mode (bump the mode); else bump
   ``r_i``, ``w_i = round_shift(alpha x_i + (beta << x_frac), exp_shift)``,
   ``N += w_i v_i``, ``Z += w_i``; a mode change (counter of ``r_i`` above the mode's)
   adds ``(alpha, beta, k_i, v_i)`` to the caches.
6. The new position: ``(p_n, r_n) = EXP(sat(s_n - m))``, ``N += p_n v_n``, ``Z += p_n``;
   ``o = sat(round_shift(N * rm, mf + e))`` with ``(rm, e) = RECIP(clamp(Z))``; then
   ``k_n, v_n`` are absorbed with ``(a_{r_n}, b_{r_n})`` and mode ``r_n`` (§1.5).

Counters (§1.4): bumping ``r`` adds one; if it passes ``counter_max`` all of the
position's counters are halved.

Past ``max_positions`` (the metadata SRAMs are full) a step is an exact pass over the KV
memory: ``golden.dense.dense_attention_bits`` over positions ``0..n`` with the dense baseline's
formats (``LadTileConfig.fallback()``), reported with ``path = StepPath.EXACT``; the LAD state
stays as it is. Past ``kv_positions`` (the KV memory's depth) a step returns ``o = 0`` with
``path = StepPath.BEYOND`` and changes nothing (docs/lad-tile.md, "Past max_positions").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch
from amaranth.lib import enum

from .config import param
from .dense import SCALE_FRAC, DenseConfig, HeadConfig, dense_attention_bits, score_raw
from .fixedpoint import FixedFormat, round_shift, saturate
from .lad_ref import LadConfig
from .sfm import SfmConfig, exp_pwl, recip
from .vpu import VpuConfig

COS_FRAC = 16         # center_cos**2 as a raw constant
CACHE_FRAC = 24       # A, B, C, D
COEF_FRAC = 16        # a, b, alpha, beta, E, F (the SFM's coefficient format)
N_FRAC = 23           # N: p (frac 15) times v (frac 8)
Z_FRAC = 15


class StepPath(enum.IntEnum, shape=2):
    """What a tile step computed (the ``path`` statistic)."""
    LAD = 0      # the LAD step (context within max_positions)
    EXACT = 1    # past max_positions: an exact pass over the KV memory (the dense baseline's arithmetic)
    BEYOND = 2   # past kv_positions: no output (o = 0), nothing changes


@dataclass(frozen=True)
class LadTileConfig(HeadConfig):
    """The tile: HeadConfig (shape, q/k/v/o format, context = metadata SRAM depth, PWL) plus LAD's own
    parameters. Derived widths of the AC datapath live here so that RTL and model read one value.
    Its defaults are the tile per KV group of SmolLM2 (3 query heads) with 8-bit centers and the PWL
    cut off at -6 (docs/lad-tile.md, "Design sweep")."""
    cutoff: float = param(-6.0, "e_R: below this x = s - m contributes nothing")
    group: int = param(3, "query heads one tile serves (a KV group; SmolLM2's 3), in lockstep on one stream "
                          "of the group's keys and values, each read once for the group: one center table, "
                          "its reciprocals and each position's center and rho serve them all")
    vpus: int = param(7, "VPUs in the pool: 2 for EAS (q.c and k.c), 1 for MD, the rest for AC's q.A rows")
    max_centers: int = param(4096, "center table entries (default: one per position, so the table cannot "
                                   "fill; when full, keys join their best center)")
    center_cos: float = param(0.98, "a key joins its best center when |cos| >= this")
    center_bits: int = param(8, "bits of a stored center element: a new center is its key in block floating "
                                "point, center_bits-bit mantissas and one exponent per center "
                                "(compact_center); 0 = kv_width, the key itself")
    counter_bits: int = param(4, "bits of each per-position, per-interval saturating mode counter")
    guard_margin: float = param(0.0, "APID widens each mode interval by this much on both sides")
    rho_width: int = param(20, "bits of the signed center ratio rho")
    rho_frac: int = param(12, "fraction bits of rho")
    cache_dot_frac: int = param(12, "fraction bits of A and D as operands of the q.A / q.D dot products")
    eas_beats: int = param(1, "cycles per center in EAS's center pass: each center is read head_dim / eas_beats "
                              "elements per cycle (the two EAS VPUs have that many lanes); divides head_dim / lanes")
    md_inflight: int = param(4, "candidates MD holds at once: their key reads are issued back to back, the "
                                "actives' value reads between them (the KV port's requests in flight)")
    kv_positions: int = param(8192, "depth of the KV memory: contexts past max_positions (up to this) are "
                                    "computed by an exact pass over it")
    ac_lanes: int = param(0, "lanes of AC's scalar-times-vector arithmetic (corrections, cache updates, N's "
                             "terms, o = N RECIP(Z)) per cycle: 0 = all lanes; fewer take lanes / ac_lanes "
                             "cycles a beat with that many times fewer multipliers (FPGA fit)")

    def validate(self):
        super().validate()
        self.require(4 <= self.vpus <= 64, f"vpus must be 4..64 (EAS 2, MD 1, AC at least 1), got {self.vpus}")
        self.require(self.head_dim % self.ac_vpus == 0,
                     f"head_dim ({self.head_dim}) must be a multiple of the AC VPUs (vpus - 3 = {self.ac_vpus})")
        self.require(1 <= self.max_centers <= self.max_positions,
                     f"max_centers must be 1..max_positions ({self.max_positions}), got {self.max_centers}")
        self.require(0.0 < self.center_cos <= 1.0, f"center_cos must be in (0, 1], got {self.center_cos}")
        self.require(self.center_bits == 0 or 2 <= self.center_bits <= self.kv_width,
                     f"center_bits must be 0 (the key) or 2..kv_width ({self.kv_width}), got {self.center_bits}")
        self.require(1 <= self.counter_bits <= 8, f"counter_bits must be 1..8, got {self.counter_bits}")
        self.require(self.guard_margin >= 0, f"guard_margin must be >= 0, got {self.guard_margin}")
        self.require(8 <= self.kv_width <= 16, f"kv_width must be 8..16, got {self.kv_width}")
        self.require(self.kv_frac == 8, f"kv_frac must be 8 (the cache formats assume it), got {self.kv_frac}")
        self.require(8 <= self.rho_width <= 24 and 4 <= self.rho_frac < self.rho_width,
                     f"rho_width must be 8..24 and rho_frac 4..rho_width-1, got {self.rho_width}.{self.rho_frac}")
        self.require(4 <= self.cache_dot_frac <= CACHE_FRAC,
                     f"cache_dot_frac must be 4..{CACHE_FRAC}, got {self.cache_dot_frac}")
        self.require(self.eas_beats >= 1 and self.beats % self.eas_beats == 0 and self.eas_lanes <= 64,
                     f"eas_beats must divide head_dim / lanes ({self.beats}) and leave at most 64 EAS lanes, "
                     f"got {self.eas_beats}")
        self.require(1 <= self.md_inflight <= 16, f"md_inflight must be 1..16, got {self.md_inflight}")
        self.require(self.ac_lanes >= 0 and (self.ac_lanes == 0 or self.lanes % self.ac_lanes == 0),
                     f"ac_lanes must be 0 (all lanes) or divide lanes ({self.lanes}), got {self.ac_lanes}")
        self.require(self.max_positions <= self.kv_positions <= 1 << 16,
                     f"kv_positions must be max_positions..65536, got {self.kv_positions}")
        self.require(self.beats >= DenseConfig.min_beats,
                     f"head_dim / lanes must be at least {DenseConfig.min_beats} (the exact pass past "
                     f"max_positions), got {self.beats}")
        self.fallback()
        self.sfm  # validates the PWL parameters
        self.reference()

    # -- derived ------------------------------------------------------------------------
    @property
    def ac_vpus(self) -> int:
        return self.vpus - 3

    @property
    def ac_group(self) -> int:
        """Lanes AC's scalar-times-vector arithmetic handles per cycle (``ac_lanes``, 0 = ``lanes``)."""
        return self.ac_lanes or self.lanes

    @property
    def ac_update_cycles(self) -> int:
        """Cycles of one pass over cache A on AC's VPUs (the q.A pass, an update): ``d / ac_vpus`` rows
        per VPU, ``beats`` words each."""
        return self.head_dim // self.ac_vpus * self.beats

    @property
    def eas_lanes(self) -> int:
        """Elements of a center (and of q, k_n) EAS reads per cycle: ``head_dim / eas_beats``."""
        return self.head_dim // self.eas_beats

    @property
    def rho_format(self) -> FixedFormat:
        return FixedFormat(self.rho_width, self.rho_frac)

    @property
    def center_width(self) -> int:
        return max(1, (self.max_centers - 1).bit_length())

    @property
    def center_element_bits(self) -> int:
        """Bits of a stored center element (a mantissa, or the key's own element)."""
        return self.center_bits or self.kv_width

    @property
    def compact_centers(self) -> bool:
        """Centers stored as mantissas and an exponent, not as their keys."""
        return self.center_element_bits < self.kv_width

    @property
    def center_exp_width(self) -> int:
        """Bits of a center's exponent, 0..kv_width - center_bits + 1 (none when the center is the key)."""
        return (self.kv_width - self.center_element_bits + 1).bit_length() if self.compact_centers else 0

    @property
    def kk_width(self) -> int:
        """Bits of |k|^2 (unsigned): d products of two kv_width-bit values."""
        return 2 * (self.kv_width - 1) + max(1, (self.head_dim - 1).bit_length()) + 1

    @property
    def z_width(self) -> int:
        """Signed bits of Z (frac 15): up to max_positions values below 2 (PWL at x > 0), cache rounding."""
        return 16 + self.position_width + 3

    @cached_property
    def sfm(self) -> SfmConfig:
        return SfmConfig(intervals=self.intervals, cutoff=self.cutoff, x_width=self.score_width,
                         x_frac=self.score_frac, recip_in_width=max(self.kk_width, self.z_width))

    @cached_property
    def score_vpu(self) -> VpuConfig:
        """MD: exact dot products of two kv-format vectors (never saturate)."""
        return VpuConfig(lanes=self.lanes, in_width=self.kv_width,
                         acc_width=2 * self.kv_width + 2 + max(1, (self.head_dim - 1).bit_length()), axpy_shift=0)

    @cached_property
    def eas_vpu(self) -> VpuConfig:
        """EAS: q.c_j and k_n.c_j, ``eas_lanes`` elements per cycle (same widths as ``score_vpu``)."""
        return VpuConfig(lanes=self.eas_lanes, in_width=self.kv_width, acc_width=self.score_vpu.acc_width, axpy_shift=0)

    # AC datapath widths (docs/lad-tile.md, formats as built): one place for RTL and model.
    ac_operand_width = 30   # A_r, D_r as q.A / q.D operands; the AXPY scalars alpha, beta, g, w
    ac_acc_width = 62       # N, A, B, C, D lanes (saturating)
    ef_width = 40           # E, F (frac 16, saturating)
    g_width = 24            # g_l = round_shift(alpha v_l, G_SHIFT): frac 16

    @cached_property
    def ac_vpu(self) -> VpuConfig:
        """AC: q.A_r / q.D_r dots and the AXPYs into N, B, C, D, A; ``a`` is always q, k or v (a
        kv beat), so a product takes two MULT18X18D, not four (none narrower than the operands)."""
        return VpuConfig(lanes=self.lanes, in_width=self.ac_operand_width, acc_width=self.ac_acc_width, axpy_shift=0,
                         a_width=min(self.kv_width, self.ac_operand_width))

    @property
    def ef_format(self) -> FixedFormat:
        return FixedFormat(self.ef_width, 0)

    @property
    def g_shift(self) -> int:
        """Right shift of alpha * v (frac COEF_FRAC + kv_frac) to g's frac 16."""
        return COEF_FRAC + self.kv_frac - 16

    def dense(self) -> DenseConfig:
        """The dense baseline at this tile's shape, formats, context and PWL (same KV bandwidth)."""
        return DenseConfig(**self.head_fields())

    def fallback(self) -> DenseConfig:
        """The exact pass past ``max_positions``: the dense baseline over the whole KV memory."""
        return DenseConfig(**{**self.head_fields(), "max_positions": self.kv_positions})

    @property
    def step_position_width(self) -> int:
        """Bits of a step's position (up to ``kv_positions``)."""
        return max(1, self.kv_positions.bit_length())

    @property
    def cos2_raw(self) -> int:
        return round(self.center_cos ** 2 * 2 ** COS_FRAC)

    @property
    def guard_raw(self) -> int:
        return int(self.sfm.x_format.quantize(self.guard_margin))

    @property
    def counter_max(self) -> int:
        return (1 << self.counter_bits) - 1

    @property
    def n_intervals(self) -> int:
        return self.intervals + 1

    @property
    def cache_dot_shift(self) -> int:
        return CACHE_FRAC - self.cache_dot_frac

    @property
    def n_cache_shifts(self) -> tuple[int, int, int]:
        """Right shifts of S*q.A_r, m*B and C into N's frac 23."""
        xf = self.sfm.x_frac
        return (self.kv_frac + self.cache_dot_frac + SCALE_FRAC - N_FRAC, xf + CACHE_FRAC - N_FRAC, CACHE_FRAC - N_FRAC)

    @property
    def z_cache_shifts(self) -> tuple[int, int, int]:
        """Right shifts of S*q.D_r, m*E and F into Z's frac 15."""
        xf = self.sfm.x_frac
        return (self.kv_frac + self.cache_dot_frac + SCALE_FRAC - Z_FRAC, xf + COEF_FRAC - Z_FRAC, COEF_FRAC - Z_FRAC)

    def reference(self) -> LadConfig:
        """The float reference (golden.lad_ref) of this tile: same algorithm parameters."""
        return LadConfig(head_dim=self.head_dim, pwl_intervals=self.intervals, pwl_cutoff=self.cutoff,
                         center_cos=self.center_cos, counter_bits=self.counter_bits,
                         guard_margin=self.guard_margin, exact_recent=1, m_rule="approx", ratio="projection",
                         max_centers=self.max_centers)


# a tile of one query head with its keys as centers and the PWL cut off at -8 (LAD tile v2)
ONE_HEAD_V2 = dict(group=1, center_bits=0, cutoff=-8.0)
PRESETS = {
    "default": LadTileConfig(),
    # one head, kv_positions = max_positions + 4: a short run steps through all three paths (LAD, exact,
    # beyond); the module benches set group and center_bits where they test them
    "small": LadTileConfig(head_dim=32, lanes=8, vpus=5, max_positions=64, max_centers=8, kv_positions=68,
                           **ONE_HEAD_V2),
    # head_dim 64 on the LFE5U-85F (docs/lad-tile.md "Synthesis"), one head: 151 of 208 DP16KD (centers
    # 2048 x 1024 bits), 96 of 156 MULT18X18D (EAS 2 x 8 lanes, one AC VPU, AC's scalar arithmetic a lane a
    # cycle); no exact pass (kv_positions = max_positions: steps past 2048 are BEYOND): with it the tile did
    # not route. The tile per KV group does not meet 100 MHz on this part yet (docs/lad-tile.md)
    "ecp5-85f": LadTileConfig(max_positions=2048, max_centers=2048, kv_positions=2048, eas_beats=8, vpus=4, ac_lanes=1,
                              **ONE_HEAD_V2),
}
# the small tile per KV group of 3 (SmolLM2's): the group RTL's lines run and its Verilog compared
# where a preset is enough (testbenches/mutation.py); not a preset of the one-head blocks (MD, AC)
PRESETS["group3"] = replace(PRESETS["small"], group=3)


# The tile's cycles per step as its schedule spends them (docs/lad-tile.md, "Cycles"): LOAD, EAS's
# center pass (eas_beats per center), APID pass A (one position per cycle), then pass B, which
# classifies one position per cycle while MD streams the candidates' key and value beats over the KV
# port (whichever is longer), and the fixed latencies (q.A combine, q.D, the new position's EXP,
# RECIP, o, absorption). The q.A pass and the A updates run in the background; they show only when
# the q.A pass is still waiting for the absorption's update at TERMS (short contexts) or when mode
# changes queue (per change, on average). The two constants are fitted on the RTL's measured steps
# by benchmarks/lad_vs_dense.py, which prints the model's error against them.
SCHEDULE_FIXED = 254.3          # cycles per step outside the passes: fitted 230.3, + 20.5 measured for AC's pipelines, + 1.5 for AC's stages, + 2.0 for the cache-terms register
SCHEDULE_PER_MODE_CHANGE = 28.4 # cycles a mode change adds on average (fitted)
# a group's tile (fitted by benchmarks/lad_vs_dense.py on 992 RTL steps of two real groups at
# group 3, 8-bit centers, cutoff -6): its step waits for its slowest AC, so a mode change (the
# busiest head's) costs more than in one head's tile; a further half cycle per position is fitted,
# most likely the heads' lockstep scan (a position moves on when every head's candidate stream has
# taken it) and the shared KV port (it reads 1.13x the union)
GROUP_SCHEDULE_FIXED = 127.8
GROUP_SCHEDULE_PER_MODE_CHANGE = 60.1
GROUP_SCHEDULE_PER_POSITION = 0.509


def schedule_constants(cfg: LadTileConfig) -> tuple[float, float, float]:
    """The schedule model's fitted ``(fixed, per mode change, per position)`` cycles for ``cfg``'s
    tile (one head's tile: no per-position term beyond its passes)."""
    if cfg.group == 1:
        return SCHEDULE_FIXED, SCHEDULE_PER_MODE_CHANGE, 0.0
    return GROUP_SCHEDULE_FIXED, GROUP_SCHEDULE_PER_MODE_CHANGE, GROUP_SCHEDULE_PER_POSITION


# compact centers (center_bits < kv_width), measured on EAS's RTL: its dots a register later (SELF's
# and SCAN's end), and a new center's words written two cycles behind their reads
COMPACT_STEP_CYCLES = 2
COMPACT_NEW_CENTER_CYCLES = 2


def schedule_cycles(cfg: LadTileConfig, position, centers_before, kv_beats, mode_changes, new_center=0,
                    constants: tuple[float, float, float] | None = None):
    """Cycles of one LAD step (``path = LAD``) at ``position`` with the step's statistics (ints or
    tensors): the schedule's model above, fitted on and checked against the RTL.

    A group's tile (``group`` g > 1; docs/lad-tile.md, "A tile per KV group") runs its heads in
    lockstep: EAS reads each center once and dots it with the g queries (g + 1 VPUs), APID
    classifies each position for every head against the shared center and rho, g MDs take the one
    stream of the group's KV beats (``kv_beats``: the union of the heads' candidates' keys and
    actives' values) and each head has its AC
    (``mode_changes``: the busiest head's). Its step is one head's schedule with the group's reads,
    plus the g - 1 further queries' beats, with the group's own constants (:func:`schedule_constants`;
    ``constants`` replace the stored ones, as the fit in benchmarks/lad_vs_dense.py does). Fitted on
    the RTL, a group's step can come out below one head's at short contexts (the one-head constants
    overestimate the group tile's RTL there)."""
    pass_b = torch.maximum(torch.as_tensor(position), torch.as_tensor(kv_beats))
    serial = cfg.eas_beats * torch.as_tensor(centers_before) + torch.as_tensor(position)
    qa_wait = (2 * cfg.ac_update_cycles - serial).clamp_min(0)   # absorption's update + q.A pass
    compact = (COMPACT_STEP_CYCLES + COMPACT_NEW_CENTER_CYCLES * torch.as_tensor(new_center)
               if cfg.compact_centers else 0)
    passes = serial + qa_wait + pass_b + compact + (cfg.group - 1) * cfg.beats
    changes = torch.as_tensor(mode_changes, dtype=torch.float64)
    fixed, per_change, per_position = constants or schedule_constants(cfg)
    return fixed + passes + per_change * changes + per_position * torch.as_tensor(position, dtype=torch.float64)


# -- typed records of a step's module transactions (the per-module benches replay them) ----------
@dataclass(frozen=True)
class MdVerdict:
    """MD's decision on one candidate (Python ints)."""
    x: int            # exact x_i = sat(s_i - m)
    r: int            # its interval
    active: bool      # r != mode: a correction (else a false alarm)
    counters: list[int]  # the position's counters after bumping r
    change: bool      # mode change: active and counter of r above the mode's
    mode: int         # the position's mode after the decision
    alpha: int        # slope delta a_r - a_mode
    beta: int         # intercept delta b_r - b_mode
    w: int            # correction weight alpha x + beta (zero for false alarms)


@dataclass(frozen=True)
class MdDecision:
    """MD (step 5) for a batch of candidates: one entry (row) per candidate, int64 tensors
    (``active``, ``change`` bool)."""
    x: torch.Tensor
    r: torch.Tensor
    active: torch.Tensor
    counters: torch.Tensor
    change: torch.Tensor
    mode: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    w: torch.Tensor

    def verdicts(self) -> list[MdVerdict]:
        """One :class:`MdVerdict` per candidate, in order."""
        cols = [self.x.tolist(), self.r.tolist(), self.active.tolist(), self.counters.tolist(), self.change.tolist(),
                self.mode.tolist(), self.alpha.tolist(), self.beta.tolist(), self.w.tolist()]
        return [MdVerdict(*row) for row in zip(*cols)]


@dataclass(frozen=True)
class StepTrace:
    """The transactions of one LAD step at position ``n``, per module, as Python ints
    and lists: what EAS, APID, MD and AC see and produce (docs/algorithms.md §1.2-1.5)."""
    n: int
    q: list[int]
    k: list[int]
    v: list[int]
    # EAS: center scores, the new key's center, approximate scores
    centers_before: int
    qcs: list[int]                # score(q, c_j) per center
    kk: int                       # |k_n|^2
    center: int
    rho: int
    new_center: bool
    s_new: int
    centers_after: int
    center_recip: tuple[int, int] | None   # RECIP(|k_n|^2) of a new center
    lookups: list[tuple[int, int]]         # (center, rho) of every absorbed position
    s_hat: list[int]
    m: int
    # AC cache terms before the step's corrections
    terms_n: list[int]
    terms_z: int
    # APID: quiet positions (mode and counters before the bump) and candidates (as sent to MD)
    quiet: list[int]
    quiet_mode: list[int]
    quiet_counters: list[list[int]]
    cand: list[int]
    cand_mode: list[int]
    cand_counters: list[list[int]]
    # MD: one verdict per candidate
    md: list[MdVerdict]
    # the new position (p_n, r_n), Z after the corrections, FINISH, absorption coefficients
    p_new: int
    r_new: int
    z: int
    z_in: int
    o: list[int]
    absorb_alpha: int
    absorb_beta: int


# -- shared integer helpers (the RTL has one twin of each) -----------------------------------------
def compact_center(k: torch.Tensor, cfg: LadTileConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A new center from raw key(s) ``k (..., d)``: ``(mantissas, exponent)`` with the smallest
    exponent ``e >= 0`` at which every ``round_shift(k_l, e)`` fits ``center_bits`` signed bits; the
    center is ``mantissas << e`` (|c_l| <= 2**(kv_width - 1), so every bound on keys holds for it).
    Its stored reciprocal stays RECIP(|k|^2) of the key it came from (EAS has |k|^2 from its SELF
    pass; |c|^2 would need another): the center test and rho use ``c`` against ``|k|``.
    Without compact centers it is the key (``e = 0``). docs/lad-tile.md, "Compact centers"."""
    b = cfg.center_element_bits
    lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
    e = torch.zeros(k.shape[:-1], dtype=torch.int64)
    for shift in range(1, cfg.kv_width - b + 2) if cfg.compact_centers else ():
        mant = round_shift(k, shift - 1)
        over = (mant.amin(-1) < lo) | (mant.amax(-1) > hi)
        e = torch.where(over, shift, e)   # the last shift whose predecessor overflowed: the smallest that fits
    mant = round_shift(k, e[..., None])
    return mant, e


def center_value(k: torch.Tensor, cfg: LadTileConfig) -> torch.Tensor:
    """The stored center of raw key(s) ``k``, as the integers EAS multiplies: ``mant << e``."""
    if not cfg.compact_centers:
        return k
    mant, e = compact_center(k, cfg)
    return mant << e[..., None]


def bump_counters(counters: torch.Tensor, r: torch.Tensor, counter_max: int) -> torch.Tensor:
    """Per row (position): counter ``r`` plus one; if it passes ``counter_max``, every counter
    of that row is halved. ``counters (P, R+1)``, ``r (P,)``; returns the new counters."""
    c = counters.clone()
    rows = torch.arange(c.shape[0])
    c[rows, r] += 1
    over = c[rows, r] > counter_max
    c[over] >>= 1
    return c


def mode_bounds(cfg: LadTileConfig) -> tuple[list[int | None], list[int | None]]:
    """Per interval ``r``: the raw lower bound ``e_{r+1} - guard`` (None: -inf) and upper bound
    ``e_r + guard`` (None: +inf) of x^ that keep a position quiet."""
    e, g = cfg.sfm.exp_boundaries_raw, cfg.guard_raw
    lo = [e[r] - g if r < cfg.intervals else None for r in range(cfg.n_intervals)]
    hi = [e[r - 1] + g if r > 0 else None for r in range(cfg.n_intervals)]
    return lo, hi


def sat_add_sequence(start, terms, fmt: FixedFormat):
    """``start + terms[0] + terms[1] + ...`` with saturation after every add (the RTL's order).
    Fast path when no partial sum leaves the range (then saturation never acted)."""
    if terms.shape[0] == 0:
        return start
    partial = start + torch.cumsum(terms, 0)
    if bool((partial <= fmt.max_raw).all()) and bool((partial >= fmt.min_raw).all()) \
            and bool((torch.as_tensor(start) <= fmt.max_raw).all()) and bool((torch.as_tensor(start) >= fmt.min_raw).all()):
        return partial[-1]
    acc = start
    for t in terms:
        acc = saturate(acc + t, fmt)
    return acc


class LadTileModel:
    """Bit-accurate LAD tile state and step. ``step(q, k, v)`` takes raw kv-format d-vectors and
    returns raw ``o`` and the step's statistics (what the RTL reports).

    ``trace``: None, or a list to which every LAD step (``path = LAD``) appends its
    :class:`StepTrace` (the transactions each module, EAS, APID, MD and AC, sees and
    produces); the per-module cocotb benches (testbenches/tb/tb_lad_*.py) replay them. ``approx_scores``,
    ``md_decide`` and ``finish`` are the step's module-level pieces, pure functions of their
    arguments (the benches also call them on stimuli outside the trace)."""

    def __init__(self, cfg: LadTileConfig, trace: list | None = None):
        self.cfg = cfg
        self.trace = trace
        d, P = cfg.head_dim, cfg.max_positions
        sfm = cfg.sfm
        self.slopes = torch.tensor(sfm.exp_slopes_raw, dtype=torch.int64)
        self.intercepts = torch.tensor(sfm.exp_intercepts_raw, dtype=torch.int64)
        lo, hi = mode_bounds(cfg)
        big = 1 << 40
        self.lo = torch.tensor([v if v is not None else -big for v in lo], dtype=torch.int64)
        self.hi = torch.tensor([v if v is not None else big for v in hi], dtype=torch.int64)
        self.n = 0
        self.K = torch.zeros(cfg.kv_positions, d, dtype=torch.int64)      # the KV memory
        self.V = torch.zeros(cfg.kv_positions, d, dtype=torch.int64)
        self.centers = torch.zeros(cfg.max_centers, d, dtype=torch.int64)
        self.center_recip: list[tuple[int, int]] = []       # (mantissa, exponent) of 1/|c|^2
        self.center_of = torch.zeros(P, dtype=torch.int64)
        self.rho = torch.zeros(P, dtype=torch.int64)
        self.mode = torch.zeros(P, dtype=torch.int64)
        self.counters = torch.zeros(P, cfg.n_intervals, dtype=torch.int64)
        self.A = torch.zeros(d, d, dtype=torch.int64)      # A[l][j]: row l = output element l
        self.B = torch.zeros(d, dtype=torch.int64)
        self.C = torch.zeros(d, dtype=torch.int64)
        self.D = torch.zeros(d, dtype=torch.int64)
        self.E = 0
        self.F = 0

    @property
    def n_centers(self) -> int:
        return len(self.center_recip)

    # -- pieces shared with the testbench ------------------------------------------------------
    def score(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Exact scaled score(s) of raw q against raw key(s), in the SFM's x format."""
        return score_raw(q, k, self.cfg)   # the dense baseline's score: same scale and rounding

    def center_update(self, k: torch.Tensor) -> tuple[int, int, bool]:
        """EAS for the new key: (center index, raw rho, became a new center)."""
        cfg = self.cfg
        mf = cfg.sfm.mantissa_frac
        kk = int((k * k).sum())
        C = self.n_centers
        best_j, best_t, best_dot = -1, -1, 0
        if C:
            dots = (self.centers[:C] * k).sum(-1).tolist()
            for j, (dot, (rc, e)) in enumerate(zip(dots, self.center_recip)):
                t = round_shift(dot * dot * rc, mf + e)
                if t > best_t:
                    best_j, best_t, best_dot = j, t, dot
        join = C > 0 and ((kk > 0 and (best_t << COS_FRAC) >= cfg.cos2_raw * kk) or C >= cfg.max_centers)
        if join:
            rc, e = self.center_recip[best_j]
            rho = saturate(round_shift(best_dot * rc, mf + e - cfg.rho_frac), cfg.rho_format)
            return best_j, rho, False
        m_, e_ = (int(t) for t in recip(torch.tensor([kk]), cfg.sfm))
        self.centers[C] = center_value(k, cfg)
        self.center_recip.append((m_, e_))
        return C, 1 << cfg.rho_frac, True

    def _cache_add(self, alpha, beta, k, v):
        """AC update of caches A-F by positions with coefficient deltas ``alpha, beta`` (1-D)
        and keys/values ``k, v`` (rows), in order; saturating."""
        if alpha.numel() == 0:
            return
        acc = self.cfg.ac_vpu.acc_format
        g = round_shift(alpha[:, None] * v, self.cfg.g_shift)   # (P, d): g_l, frac 16
        self.A = sat_add_sequence(self.A, g[:, :, None] * k[:, None, :], acc)
        self.B = sat_add_sequence(self.B, alpha[:, None] * v, acc)
        self.C = sat_add_sequence(self.C, beta[:, None] * v, acc)
        self.D = sat_add_sequence(self.D, alpha[:, None] * k, acc)
        ef = self.cfg.ef_format
        self.E = int(sat_add_sequence(torch.tensor(self.E), alpha, ef))
        self.F = int(sat_add_sequence(torch.tensor(self.F), beta, ef))

    def approx_scores(self, qcs: torch.Tensor, center: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """EAS lookups (step 2): ``s^ = sat(round_shift(qcs[center] * rho, rho_frac))`` per (center, rho)."""
        return saturate(round_shift(qcs[center] * rho, self.cfg.rho_frac), self.cfg.sfm.x_format)

    def md_decide(self, q: torch.Tensor, m: int, k: torch.Tensor, mode: torch.Tensor,
                  counters: torch.Tensor) -> MdDecision:
        """MD (step 5) for candidates with keys ``k`` (rows), modes and counters: exact ``x``,
        interval ``r``, ``active`` (r != mode), bumped ``counters``, mode ``change`` (active and
        counter of r above the mode's), new ``mode``, ``alpha, beta`` and weight ``w`` (zero
        for false alarms). Tensors, one entry (row) per candidate."""
        cfg, sfm = self.cfg, self.cfg.sfm
        x = saturate(self.score(q, k) - m, sfm.x_format)
        _, r = exp_pwl(x, sfm)
        act = r != mode
        c = bump_counters(counters, r, cfg.counter_max)
        rows = torch.arange(r.numel())
        change = act & (c[rows, r] > c[rows, mode])
        alpha = self.slopes[r] - self.slopes[mode]
        beta = self.intercepts[r] - self.intercepts[mode]
        w = round_shift(alpha * x + (beta << sfm.x_frac), sfm.exp_shift)
        return MdDecision(x=x, r=r, active=act, counters=c, change=change, mode=torch.where(change, r, mode),
                          alpha=alpha, beta=beta, w=w)

    def finish(self, N: list[int], Z: int) -> tuple[torch.Tensor, int]:
        """AC FINISH (step 6): ``o = sat(round_shift(N rm, mf + e))`` with ``(rm, e) = RECIP(clamp(Z))``;
        returns ``o`` and the clamped ``Z`` sent to RECIP."""
        cfg, sfm = self.cfg, self.cfg.sfm
        zmax = (1 << sfm.recip_in_width) - 1
        z_in = min(max(Z, 0), zmax)
        rm, e = (int(t) for t in recip(torch.tensor([z_in]), sfm))
        o = torch.tensor([saturate(round_shift(int(nl) * rm, sfm.mantissa_frac + e), cfg.kv_format)
                          for nl in N], dtype=torch.int64)
        return o, z_in

    def cache_terms(self, q: torch.Tensor, m: int) -> tuple[list[int], int]:
        """N and Z from the caches (step 3), as Python ints (products exceed 64 bits)."""
        cfg = self.cfg
        op = FixedFormat(cfg.ac_vpu.in_width, 0)
        a_r = saturate(round_shift(self.A, cfg.cache_dot_shift), op)
        d_r = saturate(round_shift(self.D, cfg.cache_dot_shift), op)
        qa = (a_r * q[None, :]).sum(-1).tolist()
        qd = int((d_r * q).sum())
        sa, sb, sc = cfg.n_cache_shifts
        za, zb, zc = cfg.z_cache_shifts
        S = cfg.scale_raw
        n_fmt = cfg.ac_vpu.acc_format
        N = [saturate(round_shift(a * S, sa) - round_shift(m * b, sb) + round_shift(c, sc), n_fmt)
             for a, b, c in zip(qa, self.B.tolist(), self.C.tolist())]
        Z = saturate(round_shift(qd * S, za) - round_shift(m * self.E, zb) + round_shift(self.F, zc),
                     FixedFormat(cfg.z_width, 0))
        return N, Z

    def exact_step(self, q, k, v, stats):
        """A step past ``max_positions``: the exact pass (or, past ``kv_positions``, no output)."""
        cfg, n = self.cfg, self.n
        stats.update(centers=self.n_centers, new_center=0, kv_beats=0)
        if n >= cfg.kv_positions:
            stats.update(path=StepPath.BEYOND)
            return torch.zeros(cfg.head_dim, dtype=torch.int64), stats
        self.K[n], self.V[n] = k, v
        o, m, z = dense_attention_bits(q, self.K[:n + 1], self.V[:n + 1], cfg.fallback())
        self.n = n + 1
        stats.update(path=StepPath.EXACT, m=m, z=z, kv_beats=2 * (n + 1) * cfg.beats)
        return o, stats

    # -- one step ----------------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        cfg, sfm = self.cfg, self.cfg.sfm
        q, k, v = (torch.as_tensor(t, dtype=torch.int64) for t in (q, k, v))
        n = self.n
        stats = {"position": n, "candidates": 0, "active": 0, "false_alarms": 0, "mode_changes": 0,
                 "path": StepPath.LAD, "m": 0, "z": 0}
        if n >= cfg.max_positions:
            return self.exact_step(q, k, v, stats)
        tracing = self.trace is not None
        xf = sfm.x_format
        # 1-2. EAS: center scores, the new key's center, approximate scores, m
        C = self.n_centers
        qcs = self.score(q, self.centers[:C]) if C else torch.zeros(0, dtype=torch.int64)
        center, rho, new_center = self.center_update(k)
        s_new = int(self.score(q, k))
        s_hat = self.approx_scores(qcs, self.center_of[:n], self.rho[:n]) if n else \
            torch.zeros(0, dtype=torch.int64)
        m = max(int(s_hat.max()), s_new) if n else s_new
        # 3. AC: cache terms with the caches as they stand
        N, Z = self.cache_terms(q, m)
        terms_z = Z
        # 4. APID
        mode = self.mode[:n]
        x_hat = saturate(s_hat - m, xf)
        cand = (x_hat < self.lo[mode]) | (x_hat >= self.hi[mode])
        quiet = (~cand).nonzero().flatten()
        if tracing:
            apid_quiet = (quiet.tolist(), self.mode[quiet].tolist(), self.counters[quiet].tolist())
        self.counters[quiet] = bump_counters(self.counters[quiet], self.mode[quiet], cfg.counter_max)
        # 5. MD
        ci = cand.nonzero().flatten()
        md = self.md_decide(q, m, self.K[ci], self.mode[ci], self.counters[ci])
        if tracing:
            apid_cand = (ci.tolist(), self.mode[ci].tolist(), self.counters[ci].tolist())
        act = md.active
        self.counters[ci] = md.counters
        changes = ci[md.change].tolist()
        ai = ci[act]
        ra = md.r[act]
        alpha, beta, w = md.alpha[act], md.beta[act], md.w[act]
        n_fmt = cfg.ac_vpu.acc_format
        Nt = torch.tensor(N, dtype=torch.int64)
        Nt = sat_add_sequence(Nt, w[:, None] * self.V[ai], n_fmt)
        zf = FixedFormat(cfg.z_width, 0)
        Z = int(sat_add_sequence(torch.tensor(Z), w, zf))
        if changes:
            ch = torch.tensor(changes, dtype=torch.int64)
            sel = torch.isin(ai, ch)
            self._cache_add(alpha[sel], beta[sel], self.K[ch], self.V[ch])
            self.mode[ch] = ra[sel]
        # 6. the new position, N/Z, absorption
        x_new = saturate(torch.tensor(s_new - m), xf)
        p_new, r_new = (int(t) for t in exp_pwl(x_new, sfm))
        Nt = sat_add_sequence(Nt, (p_new * v)[None, :], n_fmt)
        Z = int(saturate(Z + p_new, zf))
        o, z_in = self.finish(Nt.tolist(), Z)
        if tracing:
            self.trace.append(StepTrace(
                n=n, q=q.tolist(), k=k.tolist(), v=v.tolist(), centers_before=C, qcs=qcs.tolist(),
                kk=int((k * k).sum()), center=center, rho=rho, new_center=bool(new_center), s_new=s_new,
                centers_after=self.n_centers, center_recip=self.center_recip[-1] if new_center else None,
                lookups=list(zip(self.center_of[:n].tolist(), self.rho[:n].tolist())), s_hat=s_hat.tolist(), m=m,
                terms_n=N, terms_z=terms_z, quiet=apid_quiet[0], quiet_mode=apid_quiet[1],
                quiet_counters=apid_quiet[2], cand=apid_cand[0], cand_mode=apid_cand[1], cand_counters=apid_cand[2],
                md=md.verdicts(), p_new=p_new, r_new=r_new, z=Z, z_in=z_in, o=o.tolist(),
                absorb_alpha=int(self.slopes[r_new]), absorb_beta=int(self.intercepts[r_new])))
        self.K[n], self.V[n] = k, v
        self._cache_add(self.slopes[r_new].reshape(1), self.intercepts[r_new].reshape(1), k[None], v[None])
        self.center_of[n], self.rho[n], self.mode[n] = center, rho, r_new
        self.counters[n] = 0
        self.counters[n, r_new] = 1
        self.n = n + 1
        nb = cfg.beats
        stats.update(candidates=int(ci.numel()), active=int(ai.numel()), false_alarms=int(ci.numel() - ai.numel()),
                     mode_changes=len(changes), centers=self.n_centers, new_center=int(new_center), m=m, z=Z,
                     kv_beats=nb * (int(ci.numel()) + int(ai.numel())))
        return o, stats
