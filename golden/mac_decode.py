"""MAC decode engine: config and bit-accurate model of one MAC-Attention decode step
(docs/algorithms.md §2, docs/mac-unit.md "Decode engine"), mirroring the float reference
``golden.mac_ref.MacLayerState`` in the integer formats of the MAC unit (golden/mac_unit.py).

Per query head and step ``n`` (context ``L = n + 1`` keys, ``F`` sinks, band ``S``,
``lo_tail = max(F, n + 1 - S)``):

1. **Match** (only when ``L >= min_context`` and ``reuse``, the config's and the step's: a layer in
   ``full_layers`` runs with it off): the pre-RoPE query (``q_format``)
   against the head's ring of the last ``window`` queries, exact squared L2 distance, minimum,
   ties to the lower position, hit iff ``dist < threshold_raw`` (``golden.mac_unit.MatchModel``).
2. **Scores** of the post-RoPE query against the keys it needs (KV memory, ``kv_format``):
   ``s_i = sat(round_shift(q.k_i * scale_raw, score_shift))`` in the merge's score format.
3. **Range attention** (:func:`attend_bits`) of a key range ``[lo, hi)`` gives a state
   ``(m, s, o)``: ``m = max s_i``; ``p_i`` = SFM EXP2 of ``s_i - m`` rounded to ``sum_frac``
   fraction bits (``round_shift(me << (sum_frac - mantissa_frac), ke)``); ``s = sum p_i``,
   ``N = sum p_i v_i`` (exact); ``o = sat(round_shift(round_shift(N, kr - G) * r, mantissa_frac +
   G + kv_frac - out_frac))`` with ``(r, kr)`` = SFM RECIP of ``s`` and ``G = 16`` guard bits. An empty range is the empty
   state ``s = 0`` (``m = 0, o = 0``).
4. **Hit** at position ``mp``: entry(``mp``) from the entry store, band ``[lo_band, lo_tail)``
   with ``lo_band = clamp(mp + 1 - S, F, lo_tail)``; ``E = entry ⊕ band``.
   **Miss**: ``E = body ⊖ tail`` with body ``[F, L)``, tail ``[lo_tail, L)``; when the removal is
   flagged (cancellation, ``golden.mac_unit.merge_bits``) ``E`` = attention over ``[F, lo_tail)``
   (the fallback); ``E`` is empty when ``lo_tail == F``.
5. ``E`` is written to the entry store at slot ``n mod window`` and the query into the ring;
   output ``= sinks ⊕ (E ⊕ tail)`` (``o`` in ``out_format``).

⊕ / ⊖ are ``merge_bits`` (the Merge RTL's model); a merge with an empty state passes the other
state through (no merge transaction), a removal of the empty state returns state 1.

:class:`MacDecodeHead` is the readable one-head form (Python ints, ``MatchModel`` and
``merge_bits``); :class:`MacDecodeLayer` advances all query heads of a layer at once on integer
tensors and is bit-exact with one ``MacDecodeHead`` per head (testbenches/test_mac_decode.py).
:class:`MacDecodeLayer` also has the float interface of ``MacLayerState`` (``prefill``,
``decode_step``) that ``ladmac eval mac --hardware`` runs inside SmolLM2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .config import param
from .errors import ConfigError
from .fixedpoint import FixedFormat, round_shift, saturate
from .mac_ref import SMOLLM2_FULL_LAYERS, MacConfig
from .mac_unit import MacUnitConfig, MatchModel, MergeOp, merge_bits
from .sfm import exp2, exp2_relative_bound, recip, recip_relative_bound

SCALE_FRAC = 16  # 1/sqrt(d) as a raw constant with this many fraction bits (as golden.dense)


@dataclass(frozen=True)
class MacDecodeConfig(MacUnitConfig):
    band: int = param(256, "S: an entry of position p covers keys [sinks, p+1-S); the last S keys are the tail")
    min_context: int = param(2048, "match is attempted only when the step sees at least this many keys")
    sinks: int = param(4, "F: the first F keys are always attended with the current query")
    reuse: bool = param(True, "ablation: False makes every step a miss (entries still written)")
    full_layers: str = param(SMOLLM2_FULL_LAYERS, "layers of a model run whose steps all miss (the query's "
                             "reuse bit off), e.g. '14,17-18'; the default: SmolLM2-135M's costliest")
    kv_width: int = param(16, "bits of a signed post-RoPE query, key or value element")
    kv_frac: int = param(8, "fraction bits of q, k, v")
    max_positions: int = param(8192, "largest context (KV memory positions)")

    def validate(self):
        super().validate()
        try:   # band, min_context, sinks, full_layers: the float reference's checks, under this name
            self.reference()
        except ConfigError as e:
            raise ConfigError(f"{type(self).__name__}: {str(e).partition(': ')[2]}") from None
        self.require(4 <= self.kv_width <= 16, f"kv_width must be 4..16, got {self.kv_width}")
        self.require(0 <= self.kv_frac < self.kv_width, f"kv_frac must be 0..kv_width-1, got {self.kv_frac}")
        self.require(2 <= self.max_positions <= 1 << 16, f"max_positions must be 2..65536, got {self.max_positions}")
        self.require(self.sum_frac >= self.mantissa_frac,
                     f"sum_frac ({self.sum_frac}) must be >= mantissa_frac ({self.mantissa_frac})")
        self.require(self.sum_width >= self.sum_frac + self.max_positions.bit_length() + 1,
                     f"sum_width ({self.sum_width}) cannot hold a sum over max_positions ({self.max_positions})")
        self.require(self.kv_frac + self.mantissa_frac >= self.out_frac,
                     "out_frac must be <= kv_frac + mantissa_frac")
        # N = sum p v is exact in float64 arithmetic (the batched model's matmul): < 2^53
        self.require(self.max_positions * (1 << (self.sum_frac + self.kv_width - 1)) < 1 << 53,
                     "max_positions x 2^(sum_frac + kv_width - 1) must stay below 2^53")

    # -- derived -----------------------------------------------------------------------
    @property
    def kv_format(self) -> FixedFormat:
        return FixedFormat(self.kv_width, self.kv_frac)

    @property
    def scale_raw(self) -> int:
        return round(2 ** SCALE_FRAC / math.sqrt(self.head_dim))

    @property
    def score_shift(self) -> int:
        """Right shift from ``q.k * scale_raw`` (2 kv_frac + 16 fraction bits) to the score format."""
        return 2 * self.kv_frac + SCALE_FRAC - self.score_frac

    @property
    def attend_guard(self) -> int:
        """Bits of N/2^kr kept below kv_frac before the multiply by the RECIP mantissa."""
        return min(16, self.sum_frac)

    @property
    def out_shift(self) -> int:
        """Right shift of ``round_shift(N, kr - guard) * r`` to ``out_format``."""
        return self.mantissa_frac + self.attend_guard + self.kv_frac - self.out_frac

    @property
    def entry_bits(self) -> int:
        """Bits of one entry-store word set: m, s and d output elements."""
        return self.score_width + self.sum_width + self.head_dim * self.out_width

    def reference(self) -> MacConfig:
        """The float reference (``golden.mac_ref.MacConfig``) with this engine's algorithm parameters."""
        return MacConfig(window=self.window, tau=self.tau, band=self.band, min_context=self.min_context,
                         sinks=self.sinks, cancel_bound=2.0 ** -self.cancel_bits, reuse=self.reuse,
                         full_layers=self.full_layers)


PRESETS = {
    "default": MacDecodeConfig(heads=9, lanes=8),
    "tiny": MacDecodeConfig(window=8, head_dim=8, heads=2, lanes=4, band=4, min_context=10, sinks=0, max_positions=64),
    "smollm2-layer": MacDecodeConfig(window=512, head_dim=64, heads=9, lanes=16),
}


# -- integer primitives (vectorised over leading dimensions) --------------------------------
def scores_bits(q: torch.Tensor, k: torch.Tensor, cfg: MacDecodeConfig) -> torch.Tensor:
    """Raw scores of raw queries ``q (..., d)`` against raw keys ``k (..., L, d)``: ``(..., L)``.
    The dot products are exact (float64 holds them: |q.k| < 2^(2 kv_width - 2) d < 2^53)."""
    return score_from_dots((k.double() @ q.double().unsqueeze(-1)).squeeze(-1), cfg)


def score_from_dots(dots: torch.Tensor, cfg: MacDecodeConfig) -> torch.Tensor:
    """Scaled raw scores from exact dot products (held in float64)."""
    return saturate(round_shift(dots.round().long() * cfg.scale_raw, cfg.score_shift), cfg.score_format)


def attend_bits(s: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cfg: MacDecodeConfig):
    """Range attention: state ``(m (...,), s (...,), o (..., d))`` over the keys where ``mask (..., L)``
    from raw scores ``s (..., L)`` and raw values ``v (..., L, d)`` (broadcast over s's dims);
    rows with no key give the empty state (0, 0, 0)."""
    sf = cfg.score_format
    if s.shape[-1] == 0:
        zero = torch.zeros(s.shape[:-1], dtype=torch.long)
        return zero, zero.clone(), torch.zeros(*s.shape[:-1], v.shape[-1], dtype=torch.long)
    m = torch.where(mask, s, torch.full_like(s, sf.min_raw)).max(-1).values
    x = saturate(s - m.unsqueeze(-1), sf)
    me, ke = exp2(x, cfg.sfm)
    p = round_shift(me << (cfg.sum_frac - cfg.mantissa_frac), ke)
    p = torch.where(mask, p, torch.zeros_like(p))
    z = p.sum(-1)
    if v.dim() == p.dim() + 1 and v.shape[-3] == 1:      # values shared by p's second-last dim
        n = (p.double() @ v.squeeze(-3).double()).round().long()
    else:
        n = (p.double().unsqueeze(-2) @ v.double()).squeeze(-2).round().long()  # exact (validate's bound)
    z_sat = saturate(z, cfg.sum_format)
    r, kr = recip(z_sat, cfg.sfm)
    pre = (kr - cfg.attend_guard).clamp_min(0)          # z >= 2^sum_frac: kr >= sum_frac >= guard
    o = saturate(round_shift(round_shift(n, pre.unsqueeze(-1)) * r.unsqueeze(-1), cfg.out_shift), cfg.out_format)
    empty = z == 0
    zero = torch.zeros_like(m)
    return (torch.where(empty, zero, m), torch.where(empty, zero, z_sat),
            torch.where(empty.unsqueeze(-1), torch.zeros_like(o), o))


def attend_error_bound(n: int, z_raw: int, max_v: float, cfg: MacDecodeConfig) -> tuple[float, float]:
    """Bound on ``(max |o_bits - o_float|, |lse_bits - lse_float|)`` of :func:`attend_bits` over ``n``
    keys with sum ``z_raw`` vs float64 softmax attention on the same quantised q, k, v (d a power of
    4, so ``scale_raw`` is exact). Scores are rounded to half an LSB ``ds`` each (a weight ratio to
    ``2 ds``); EXP2 has relative error ``e_x`` where a key's weight is at least ``2^-sum_frac``
    (``|x| <= (sum_frac + 2) ln 2``), and every ``p_i`` is within ``2^-sum_frac`` of its exact value
    (below that weight it rounds to 0 or 1 LSB); RECIP adds ``e_r``; then the guard and output
    roundings. A perturbation of every weight by a relative ``e`` moves a weighted mean by at most
    ``2e/(1-e) max|v|``."""
    ds = 2.0 ** -(cfg.score_frac + 1)
    e_x = float(exp2_relative_bound(torch.tensor((cfg.sum_frac + 2) * math.log(2)), cfg.sfm))
    e = math.exp(2 * ds) * (1 + e_x) - 1
    z = max(z_raw * 2.0 ** -cfg.sum_frac, 1.0)
    absolute = n * 2.0 ** -cfg.sum_frac / z
    b_o = ((2 * e / (1 - e) + recip_relative_bound(cfg.sfm) + 2 * absolute) * max_v
           + 2.0 ** -(cfg.out_frac + 1) + 2.0 ** -(cfg.kv_frac + cfg.attend_guard - 1))
    b_lse = 2 * ds + e_x + absolute + 2.0 ** -cfg.sum_frac
    return b_o, b_lse


def merge_batch(op: int, m1, s1, o1, m2, s2, o2, cfg: MacDecodeConfig):
    """``golden.mac_unit.merge_bits`` on tensors (heads along dim 0): ``(m, s, o, flagged)``."""
    sfm, frac = cfg.sfm, cfg.mantissa_frac
    diff = m1 - m2
    first = diff >= 0
    m = torch.where(first, m1, m2)
    x = torch.clamp(-diff.abs(), min=sfm.x_format.min_raw)
    me, ke = exp2(x, sfm)
    small = torch.where(first, s2, s1)
    scaled = torch.where(x == 0, small, round_shift(small * me, frac + ke))
    a = torch.where(first, s1, scaled)
    b = torch.where(first, scaled, s2)
    s_full = a + b if op == MergeOp.MERGE else a - b
    flagged = s_full <= 0
    if op == MergeOp.DOWNDATE:
        flagged = flagged | ((s_full << cfg.cancel_bits) < a)
    s = saturate(s_full, cfg.sum_format)
    r, kr = recip(s, sfm)
    w1 = round_shift(a * r, kr)
    w2 = round_shift(b * r, kr)
    if op == MergeOp.DOWNDATE:
        w2 = -w2
    o = saturate(round_shift(w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2, frac), cfg.out_format)
    return (m, torch.where(flagged, torch.zeros_like(s), s),
            torch.where(flagged.unsqueeze(-1), torch.zeros_like(o), o), flagged)


def combine(op: int, st1, st2, cfg: MacDecodeConfig):
    """⊕ / ⊖ of two state tuples ``(m, s, o)`` with the engine's empty-state rules: an empty
    state 2 returns state 1; for ⊕ an empty state 1 returns state 2. Returns ``(state, flagged,
    merged)``: ``merged`` marks the rows that used the merge unit."""
    m, s, o, flagged = merge_batch(op, *st1, *st2, cfg)
    e1, e2 = st1[1] == 0, st2[1] == 0
    pass1 = e2
    pass2 = e1 & ~e2 if op == MergeOp.MERGE else torch.zeros_like(e1)
    out = []
    for r, a, b in zip((m, s, o), st1, st2):
        c1 = pass1 if r.dim() == 1 else pass1.unsqueeze(-1)
        c2 = pass2 if r.dim() == 1 else pass2.unsqueeze(-1)
        out.append(torch.where(c1, a, torch.where(c2, b, r)))
    return tuple(out), flagged & ~pass1 & ~pass2, ~pass1 & ~pass2


# -- step bookkeeping ------------------------------------------------------------------------
@dataclass
class HeadStep:
    """What one head's decode step did (the RTL's statistics beat)."""
    engaged: bool
    hit: bool
    position: int        # matched position (-1 when none)
    distance: int
    fallback: bool       # miss whose body ⊖ tail was flagged: prefix recomputed
    kv_keys: int         # keys (and values) this head needs from KV memory
    m: int = 0
    s: int = 0
    o: list[int] = field(default_factory=list)
    # the engine's program (its KV reads, engine_step_cycles): each range pass's positions
    # (lo, hi) in the RTL's order (an empty range too), and how each ⊕ / ⊖ went: "merge",
    # "cancelled" (flagged) or "pointer" (an empty operand: no transaction)
    passes: tuple[tuple[int, int], ...] = ()
    combines: tuple[str, ...] = ()
    slot: int = 0        # the ring and entry-store slot of this step's query and entry


def step_ranges(cfg: MacDecodeConfig, n: int):
    """``(F, lo_tail, L)`` of the step at position ``n``."""
    L = n + 1
    return cfg.sinks if cfg.sinks < L else L, max(min(cfg.sinks, L), n + 1 - cfg.band), L


# -- one head, readable form -------------------------------------------------------------------
class MacDecodeHead:
    """One query head of the decode engine, bit-accurate (the RTL's per-head model). Keys and values
    are passed in full each step (the KV memory); the head keeps its ring (``MatchModel``) and
    entry store. Its steps come at consecutive positions from any first one (0, or where the engine
    takes over a sequence whose prompt was processed elsewhere: its ring starts empty there); ring
    and entry slots count the head's steps, a match's position is the head's first position plus the
    matched step's count (an empty ring: the step's own position, as the match's count is 0)."""

    def __init__(self, cfg: MacDecodeConfig):
        self.cfg = cfg
        self.match = MatchModel(MacUnitConfig(**{k: getattr(cfg, k) for k in MacUnitConfig.__dataclass_fields__
                                                 if k != "heads"}, heads=1))
        self.entry_m = [0] * cfg.window
        self.entry_s = [0] * cfg.window
        self.entry_o = [[0] * cfg.head_dim for _ in range(cfg.window)]

    def _attend(self, s: torch.Tensor, v: torch.Tensor, lo: int, hi: int):
        self._passes.append((lo, hi))
        mask = torch.zeros(s.shape[-1], dtype=torch.bool)
        mask[lo:hi] = True
        m, z, o = attend_bits(s.unsqueeze(0), v.unsqueeze(0), mask.unsqueeze(0), self.cfg)
        return int(m[0]), int(z[0]), torch.as_tensor(o[0])

    def _combine(self, op, st1, st2):
        m1, s1, o1 = st1
        m2, s2, o2 = st2
        if s2 == 0 or (s1 == 0 and op == MergeOp.MERGE):
            self._combines.append("pointer")
            return (st1 if s2 == 0 else st2), False
        r = merge_bits(op, m1, s1, torch.as_tensor(o1), m2, s2, torch.as_tensor(o2), self.cfg)
        self._combines.append("cancelled" if r.flagged else "merge")
        return (r.m, r.s, torch.tensor(r.o, dtype=torch.int64)), r.flagged

    def step(self, q_pre: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int,
             reuse: bool = True):
        """Raw ``q_pre, q (d,)``, keys/values ``k, v (n+1, d)`` -> raw output ``o (d,)`` and a :class:`HeadStep`.
        ``reuse`` is the step's bit (the RTL query's): False makes it a miss, as ``full_layers`` does."""
        cfg = self.cfg
        self._passes, self._combines = [], []
        F, lo_tail, L = step_ranges(cfg, n)
        engaged = cfg.reuse and reuse and L >= cfg.min_context
        steps = self.match.count[0]            # this head's steps before this one
        slot = steps % cfg.window
        if engaged:
            res = self.match.query(0, q_pre)
        else:  # no match: the query is only written into the ring
            res = None
            self.match.ring[0, self.match.count[0] % cfg.window] = q_pre
            self.match.count[0] += 1
        hit = bool(res is not None and res.hit)
        s = scores_bits(q, k, cfg)
        tail = self._attend(s, v, lo_tail, L)
        fallback = False
        position = -1 if res is None else n - steps + res.position   # the head's first position + the match's count
        if hit:
            lo_band = min(max(position + 1 - cfg.band, F), lo_tail)
            es = res.slot
            entry = (self.entry_m[es], self.entry_s[es], torch.tensor(self.entry_o[es], dtype=torch.int64))
            e, _ = self._combine(MergeOp.MERGE, entry, self._attend(s, v, lo_band, lo_tail))
            keys = F + (L - lo_band)
        else:
            keys = L
            if lo_tail == F:
                e = (0, 0, torch.zeros(cfg.head_dim, dtype=torch.int64))
                self._passes.append((F, F))   # the engine's empty middle range
            else:
                e, fallback = self._combine(MergeOp.DOWNDATE, self._attend(s, v, F, L), tail)
                if fallback:
                    e = self._attend(s, v, F, lo_tail)
        self.entry_m[slot], self.entry_s[slot], self.entry_o[slot] = e[0], e[1], [int(x) for x in e[2]]
        out, _ = self._combine(MergeOp.MERGE, e, tail)
        out, _ = self._combine(MergeOp.MERGE, self._attend(s, v, 0, F), out)
        info = HeadStep(engaged, hit, position, res.distance if res is not None else -1, fallback, keys, out[0],
                        out[1], [int(x) for x in out[2]], tuple(self._passes), tuple(self._combines), slot)
        return out[2], info


# -- a layer's heads at once -------------------------------------------------------------------
class MacDecodeLayer:
    """The decode engine's model for all ``q_heads`` query heads of one layer (GQA: ``kv_heads``
    groups), on integer tensors; bit-exact with one :class:`MacDecodeHead` per head. Raw interface
    :meth:`step_raw`; float interface :meth:`prefill` / :meth:`decode_step` like
    ``golden.mac_ref.MacLayerState`` (inputs quantised here, saturations counted)."""

    def __init__(self, cfg: MacDecodeConfig, q_heads: int, kv_heads: int, head_dim: int | None = None,
                 scale: float | None = None):
        if q_heads % kv_heads:
            raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
        d = head_dim if head_dim is not None else cfg.head_dim
        if d != cfg.head_dim:
            raise ValueError(f"head_dim {d} != the engine's head_dim {cfg.head_dim}")
        if scale is not None and abs(scale * math.sqrt(d) - 1) > 1e-6:
            raise ValueError(f"the engine scales scores by 1/sqrt(head_dim); the model uses {scale}")
        self.cfg, self.hq, self.hkv, self.d = cfg, q_heads, kv_heads, d
        M = cfg.window
        self.ring_q = torch.zeros(q_heads, M, d, dtype=torch.int64)
        self.ring_pos = torch.full((M,), -1, dtype=torch.long)
        self.entry_m = torch.zeros(q_heads, M, dtype=torch.int64)
        self.entry_s = torch.zeros(q_heads, M, dtype=torch.int64)
        self.entry_o = torch.zeros(q_heads, M, d, dtype=torch.int64)
        self.k_raw = torch.zeros(kv_heads, 0, d, dtype=torch.int64)
        self.v_raw = torch.zeros(kv_heads, 0, d, dtype=torch.int64)
        self.saturated = 0

    # -- raw ---------------------------------------------------------------------------------
    def _group(self, t: torch.Tensor) -> torch.Tensor:
        """``(Hkv, L, d)`` -> per query head ``(Hq, L, d)`` (a view)."""
        g = self.hq // self.hkv
        return t.unsqueeze(1).expand(self.hkv, g, *t.shape[1:]).reshape(self.hq, *t.shape[1:])

    def _attend(self, s, v, lo, hi, base: int = 0):
        """State over ``[lo, hi)`` per head (tensors (Hq,)) from scores ``s (Hq, W)`` of keys ``base..``."""
        idx = torch.arange(s.shape[-1]) + base
        mask = (idx >= lo.unsqueeze(-1)) & (idx < hi.unsqueeze(-1))
        return attend_bits(s, v, mask, self.cfg)

    def match(self, q_pre: torch.Tensor):
        """``(hit, position, distance)`` per head against the ring (before the query is written)."""
        usable = (self.ring_pos >= 0).unsqueeze(0).expand(self.hq, -1)
        dist = ((self.ring_q - q_pre.unsqueeze(1)) ** 2).sum(-1)
        big = torch.iinfo(torch.int64).max
        dist = torch.where(usable, dist, torch.full_like(dist, big))
        best = dist.min(-1).values
        key = torch.where(dist == best.unsqueeze(-1), self.ring_pos.unsqueeze(0).expand_as(dist),
                          torch.full_like(dist, big))
        pos = key.min(-1).values
        any_usable = usable.any(-1)
        pos = torch.where(any_usable, pos, torch.full_like(pos, -1))
        hit = any_usable & (best < self.cfg.threshold_raw)
        return hit, pos, best

    def step_raw(self, q_pre: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int):
        """Raw ``q_pre, q (Hq, d)``, ``k, v (Hkv, n+1, d)`` -> raw ``o (Hq, d)`` and the step's
        per-head tensors (``hit``, ``position``, ``fallback``, ``kv_keys``, ``engaged``)."""
        cfg, H = self.cfg, self.hq
        F, lo_tail, L = step_ranges(cfg, n)
        if k.shape[1] != L:
            raise ValueError(f"step at position {n} needs {L} keys, got {k.shape[1]}")
        full = lambda x: torch.full((H,), x, dtype=torch.long)  # noqa: E731
        engaged = cfg.reuse and L >= cfg.min_context
        if engaged:
            hit, mpos, dist = self.match(q_pre)
        else:
            hit, mpos, dist = torch.zeros(H, dtype=torch.bool), full(-1), full(-1)
        lo_band = (mpos + 1 - cfg.band).clamp(min=F, max=lo_tail)
        any_hit, any_miss = bool(hit.any()), bool((~hit).any())
        # the keys some head needs: [0, F) and [lo, L) with lo the lowest band start (all for a miss)
        lo_need = F if any_miss else int(lo_band[hit].min())
        kg, vg = self._group(k[:, lo_need:]), self._group(v[:, lo_need:])
        s = scores_bits(q, kg, cfg)                                 # (H, L - lo_need)
        tail = self._attend(s, vg, full(lo_tail), full(L), lo_need)
        if F:
            ks, vs = self._group(k[:, :F]), self._group(v[:, :F])
            sink = attend_bits(scores_bits(q, ks, cfg), vs, torch.ones(H, F, dtype=torch.bool), cfg)
        else:
            sink = (full(0), full(0), torch.zeros(H, self.d, dtype=torch.long))
        fallback = torch.zeros(H, dtype=torch.bool)
        no = torch.zeros(H, dtype=torch.bool)
        flag_hit = used_hit = flag_miss = used_miss = no       # the first combine's transaction per head
        e = None
        if any_hit:
            slot = mpos.clamp_min(0) % cfg.window
            ar = torch.arange(H)
            entry = (self.entry_m[ar, slot], self.entry_s[ar, slot], self.entry_o[ar, slot])
            band = self._attend(s, vg, lo_band, full(lo_tail), lo_need)
            e, flag_hit, used_hit = combine(MergeOp.MERGE, entry, band, cfg)
        if any_miss:
            if lo_tail == F:
                miss = (full(0), full(0), torch.zeros(H, self.d, dtype=torch.long))
            else:
                body = self._attend(s, vg, full(F), full(L), lo_need)
                miss, fallback, used_miss = combine(MergeOp.DOWNDATE, body, tail, cfg)
                flag_miss = fallback
                fallback = fallback & ~hit
                if bool(fallback.any()):
                    exact = self._attend(s, vg, full(F), full(lo_tail), lo_need)
                    miss = tuple(torch.where(fallback if a.dim() == 1 else fallback.unsqueeze(-1), b, a)
                                 for a, b in zip(miss, exact))
            e = miss if e is None else tuple(torch.where(hit if a.dim() == 1 else hit.unsqueeze(-1), a, b)
                                             for a, b in zip(e, miss))
        slot_n = n % cfg.window
        self.ring_pos[slot_n] = n
        self.ring_q[:, slot_n] = q_pre
        self.entry_m[:, slot_n], self.entry_s[:, slot_n], self.entry_o[:, slot_n] = e
        o, flag_o, used_o = combine(MergeOp.MERGE, e, tail, cfg)
        out, flag_out, used_out = combine(MergeOp.MERGE, sink, o, cfg)
        kv_keys = torch.where(hit, F + (L - lo_band), full(L))
        # the engine RTL's cycles of each head's step (engine_step_cycles, on tensors): its range
        # passes' lengths and its combines' transactions, as MacDecodeHead records them
        tail_n, sink_n = L - lo_tail, full(F)
        miss_n = torch.where(fallback, lo_tail - F, 0)          # the prefix recomputed on a fallback
        ranges = [full(tail_n), torch.where(hit, lo_tail - lo_band, L - F if lo_tail != F else 0), sink_n]
        made = hit | (lo_tail != F)                             # a miss over an empty middle combines nothing
        first = (made, torch.where(hit, used_hit, used_miss), torch.where(hit, flag_hit, flag_miss))
        yes = ~no
        combines = [first, (yes, used_o, flag_o), (yes, used_out, flag_out)]
        rtl = engine_cycles_batch(cfg, engaged, hit, kv_keys, ranges, miss_n, combines, min(n, cfg.window))
        info = {"engaged": engaged, "hit": hit, "position": mpos, "distance": dist, "fallback": fallback,
                "kv_keys": kv_keys, "m": out[0], "s": out[1], "rtl_cycles": rtl}
        return out[2], info

    def prefill_raw(self, q_pre: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Entries of the last ``window`` positions of a prefill ``0..P-1`` (raw ``q_* (Hq, P, d)``,
        ``k, v (Hkv, P, d)``): range attention over ``[F, p+1-S)`` with the query of ``p``."""
        cfg, P = self.cfg, q_pre.shape[1]
        first = max(0, P - cfg.window)
        pos = torch.arange(first, P)
        hi = (pos + 1 - cfg.band).clamp_min(min(cfg.sinks, P))
        top = int(hi.max()) if pos.numel() else 0
        F = min(cfg.sinks, P)
        kg, vg = self._group(k[:, F:top]), self._group(v[:, F:top])
        idx = torch.arange(F, top)
        for c in range(0, pos.numel(), 64):
            sl = slice(c, c + 64)
            if top > F:
                s = score_from_dots(q[:, first:][:, sl].double() @ kg.double().transpose(1, 2), cfg)  # (H, c, W)
                mask = (idx < hi[sl].unsqueeze(-1)).unsqueeze(0).expand(self.hq, -1, -1)
                m, z, o = attend_bits(s, vg.unsqueeze(1), mask, cfg)
            else:
                cnt = pos[sl].numel()
                m = torch.zeros(self.hq, cnt, dtype=torch.long)
                z, o = m.clone(), torch.zeros(self.hq, cnt, self.d, dtype=torch.long)
            slots = pos[sl] % cfg.window
            self.entry_m[:, slots], self.entry_s[:, slots], self.entry_o[:, slots] = m, z, o
        slots = pos % cfg.window
        self.ring_pos[slots] = pos
        self.ring_q[:, slots] = q_pre[:, first:]

    # -- float interface (MacLayerState's) ------------------------------------------------------
    def _quantize(self, x: torch.Tensor, fmt: FixedFormat) -> torch.Tensor:
        raw = fmt.quantize(x.double())
        self.saturated += int(((raw == fmt.max_raw) | (raw == fmt.min_raw)).sum())
        return raw

    def _kv(self, k: torch.Tensor, v: torch.Tensor):
        """Raw KV memory of ``k, v (Hkv, L, d)``, quantising only the positions not yet stored."""
        have, L = self.k_raw.shape[1], k.shape[1]
        if have > L:
            raise ValueError("the KV cache shrank")
        if have < L:
            f = self.cfg.kv_format
            self.k_raw = torch.cat([self.k_raw, self._quantize(k[:, have:], f)], 1)
            self.v_raw = torch.cat([self.v_raw, self._quantize(v[:, have:], f)], 1)
        return self.k_raw, self.v_raw

    def prefill(self, q_pre: torch.Tensor, q_post: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kr, vr = self._kv(k, v)
        self.prefill_raw(self._quantize(q_pre, self.cfg.q_format), self._quantize(q_post, self.cfg.kv_format), kr, vr)

    def decode_step(self, q_pre: torch.Tensor, q_post: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    position: int):
        """Float ``(Hq, d)`` output of position ``position`` and the step's stats (the float
        reference's keys, plus ``saturated`` elements and entry-store / KV bytes)."""
        cfg, H, n = self.cfg, self.hq, position
        kr, vr = self._kv(k, v)
        sat0 = self.saturated
        o, info = self.step_raw(self._quantize(q_pre.reshape(H, -1), cfg.q_format),
                                self._quantize(q_post.reshape(H, -1), cfg.kv_format), kr, vr, n)
        g = H // self.hkv
        L = n + 1
        hit = info["hit"]
        group_read = torch.where(hit.view(self.hkv, g).all(1), info["kv_keys"].view(self.hkv, g).max(1).values,
                                 torch.full((self.hkv,), L, dtype=torch.long))
        hits = int(hit.sum())
        engaged = info["engaged"]
        stats = {"engaged": bool(engaged), "hits": hits, "misses": H - hits if engaged else 0, "heads": H,
                 "fallbacks": int(info["fallback"].sum()), "kv_read": int(group_read.sum()),
                 "kv_total": int(self.hkv * L), "skip_ratio": 1.0 - float(group_read.sum()) / float(self.hkv * L),
                 "saturated": self.saturated - sat0, **step_bytes(cfg, info, self.hkv, L)}
        F, lo_tail, _ = step_ranges(cfg, n)
        cyc = head_step_cycles(cfg, L, info["kv_keys"], info["hit"].long(), engaged, min(n, cfg.window),
                               info["fallback"].long() * (lo_tail - F))
        stats.update(engine_cycles=float(cyc.sum()), rtl_cycles=float(info["rtl_cycles"].sum()),
                     dense_cycles=float(H * dense_head_cycles(cfg, L)),
                     # each query head's own keys read, as the float reference counts them
                     head_kv_read=int(info["kv_keys"].sum()), head_kv_total=int(H * L))
        return cfg.out_format.to_float(o), stats


# -- cycles: the schedule's model (docs/mac-unit.md, "Decode engine") ----------------------------
MATCH_OVERHEAD = 14     # MatchUnit: cycles per match beyond M d/L + 2 d/L (docs/mac-unit.md, RTL-measured; read latency 5, VPU 7)
MERGE_CYCLES = 22       # MergeUnit: cycles per merge/removal transaction (scalar phase, RTL-measured)
RANGE_PASS_CYCLES = 43  # a range pass's cycles besides its count·B + B beats (engine RTL, checked cycle-exactly)
PASS_LATENCY = 8        # VPU / SFM pipeline fill of one K or V pass
NORM_CYCLES = 12        # RECIP of a range state's sum and its first output beat
# the state SRAM's read latency: its read address comes from a register and its data leaves the
# block RAMs' output registers into an output FIFO, so the read pipeline never stalls (straight
# from a DP16KD's read port it was the routed worst path, 11.65 ns; the pipeline's stall-all
# enable, chosen by the reading state, was the next, 11.46 ns)
STATE_READ_LATENCY = 4
# a MergeUnit transaction in the engine besides its B beats: its operands' read and queue
# (FifoSlice), the scalar phase (EXP2, RECIP) and the vector pipeline; no RECIP when flagged
COMBINE_MERGE_CYCLES = 32 + STATE_READ_LATENCY
COMBINE_CANCELLED_CYCLES = 22 + STATE_READ_LATENCY


def head_step_cycles(cfg: MacDecodeConfig, L: int, keys, hit, engaged: bool, filled: int, fallback_keys=0):
    """Cycles of one head's decode step on the planned engine (one VPU of ``lanes`` lanes, one SFM,
    the KV port delivering one beat of ``lanes`` elements per cycle, steps not overlapped): match
    (the MatchUnit's measured ``filled d/L + 2 d/L + 10``; a ring write only when not engaged), a K
    pass and a V pass over the ``keys`` it reads (``d/L`` beats each, tail / band / body accumulated
    in the same V pass), a second V pass over ``fallback_keys`` when a removal cancels, the entry read
    on a hit and write, two MergeUnit transactions (plus one for sinks), normalisation of two range
    states. ``keys``, ``hit``, ``fallback_keys``: ints or tensors (per head)."""
    B = cfg.beats
    match = filled * B + 2 * B + MATCH_OVERHEAD if engaged else B
    passes = 2 * (keys * B + PASS_LATENCY) + fallback_keys * B
    entry = B + (hit * B if not isinstance(hit, bool) else (B if hit else 0))
    merges = (2 + (1 if cfg.sinks else 0)) * MERGE_CYCLES
    return match + passes + entry + merges + 2 * (NORM_CYCLES + B)


DISPATCH_TASKS = 10   # the engine's program: one DISPATCH cycle per task


def engine_step_cycles(cfg: MacDecodeConfig, st: HeadStep, filled: int) -> int:
    """Cycles of one head's step on the engine RTL as built (hdl/mac/decode.py, the statistics
    beat's ``cycles``) when no stream stalls or gaps and the KV memory and entry store answer one
    cycle after a request: its FSM's states one after another, each state's cycles read from a
    waveform (docs/mac-unit.md, "Decode engine"). ``st``: the step's
    :class:`HeadStep` (its program), ``filled``: the head's ring entries before the step."""
    B = cfg.beats
    if not st.engaged:
        match = 1                        # the ring is scanned and written in the background
    else:                                # the MatchUnit's scan; an empty ring answers at once
        match = filled * B + 14 if filled else 2
    head = B + match + 3                 # LOAD (the query's beats), MATCH, RANGES, RANGES2, RANGES3
    keys = st.kv_keys * B + 12 + (cfg.sinks == 0)   # KEYS: DOT, three score stages (no sinks: a request cycle)
    # a range: R_START, its V burst through EXP2 / p / AXPY, R_RECIP, RECIP's latency, R_OUT (B
    # beats through the output pipeline): count·B + B + RANGE_PASS_CYCLES; an empty one: R_START alone
    ranges = sum((hi - lo) * B + B + RANGE_PASS_CYCLES if hi > lo else 1 for lo, hi in st.passes)
    # COMBINE, then a MergeUnit transaction: scalar phase and B beats; a flagged one skips RECIP
    merge = {"merge": B + COMBINE_MERGE_CYCLES, "cancelled": B + COMBINE_CANCELLED_CYCLES, "pointer": 0}
    combines = sum(1 + merge[c] for c in st.combines)
    entry = (B + 1) * int(st.hit) + B + STATE_READ_LATENCY   # ENTRY_READ (hit), ENTRY_WRITE (E from the state SRAM)
    emit = B + STATE_READ_LATENCY        # EMIT: the o beats from the state SRAM (their read and B)
    return head + keys + DISPATCH_TASKS + ranges + combines + entry + emit


def engine_cycles_batch(cfg: MacDecodeConfig, engaged: bool, hit, kv_keys, ranges, fallback_keys, combines,
                        filled: int):
    """:func:`engine_step_cycles` for a layer's heads at once (tensors (H,)): ``ranges`` the keys of
    each range pass that every step makes (tail, band or body, sinks; 0 = an empty pass),
    ``fallback_keys`` the extra pass's keys on a fallback (0: no pass), ``combines`` per combine
    ``(made, used the MergeUnit, flagged)``. Equal to :func:`engine_step_cycles` of the same steps
    (testbenches/test_mac_decode.py)."""
    B = cfg.beats
    match = (filled * B + 14 if filled else 2) if engaged else 1
    cyc = B + match + 3 + kv_keys * B + 12 + (cfg.sinks == 0) + DISPATCH_TASKS
    for count in ranges:
        cyc = cyc + torch.where(count > 0, count * B + B + RANGE_PASS_CYCLES, 1)
    cyc = cyc + torch.where(fallback_keys > 0, fallback_keys * B + B + RANGE_PASS_CYCLES, 0)
    for made, used, flagged in combines:
        transaction = torch.where(flagged, B + COMBINE_CANCELLED_CYCLES, B + COMBINE_MERGE_CYCLES)
        cyc = cyc + torch.where(made, 1 + torch.where(used, transaction, 0), 0)
    return cyc + (B + 1) * hit.long() + 2 * (B + STATE_READ_LATENCY)


def dense_head_cycles(cfg: MacDecodeConfig, L: int) -> int:
    """The dense baseline's head step at the same KV bandwidth (one beat per cycle): a K pass and a V
    pass over all L keys, one normalisation."""
    B = cfg.beats
    return 2 * (L * B + PASS_LATENCY) + NORM_CYCLES + B


def step_bytes(cfg: MacDecodeConfig, info: dict, kv_heads: int, L: int) -> dict:
    """Bytes one layer-step moves: KV memory (keys and values of the group reads, as the GQA read
    rule), entry store (entry read on a hit, entry write, ring scan and ring write) and the dense
    baseline's KV bytes."""
    H = info["hit"].numel()
    g = H // kv_heads
    hit = info["hit"]
    group = torch.where(hit.view(kv_heads, g).all(1), info["kv_keys"].view(kv_heads, g).max(1).values,
                        torch.full((kv_heads,), L, dtype=torch.long))
    vec = cfg.head_dim * cfg.kv_width / 8
    ring_vec = cfg.head_dim * cfg.q_width / 8
    filled = min(L - 1, cfg.window)
    entry = cfg.entry_bits / 8
    es = H * (entry + ring_vec) + int(hit.sum()) * entry + (H * filled * ring_vec if info["engaged"] else 0)
    return {"kv_bytes": float(2 * vec * int(group.sum())), "entry_bytes": float(es),
            "dense_kv_bytes": float(2 * vec * kv_heads * L)}
