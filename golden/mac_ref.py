"""Float reference of MAC-Attention decoding for one layer (docs/algorithms.md §2).

Attention states are ``(o, lse)``: normalised output and natural-log sum-exp.
:func:`merge_states` is ⊕ (online-softmax merge), :func:`downdate_states` is ⊖ (removal,
``t = exp(l2 - l1)``, ``lse = l1 + ln(1 - t)``, ``o = (o1 - t o2) exp(l1 - lse)``) and flags
``1 - t < cancel_bound`` instead of returning garbage. :class:`MacLayerState` holds the ring
of pre-RoPE queries and the downdated entries per query head; :meth:`MacLayerState.decode_step`
does match (L2 < sqrt(2d)(1 - tau), ties to the lower position), prefix ⊕ band ⊕ tail on a
hit (entry written before the tail merge), full attention with entry = full ⊖ tail on a miss
(exact prefix recompute when that cancels), the GQA read rule, sinks and min context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .config import BlockConfig, param

NEG_INF = -math.inf
# SmolLM2-135M's layers whose hits cost the most KL per KV skipped, measured one layer at a time on
# text no evaluation scores (benchmarks.mac_layers; docs/results_decode.md, "Choosing the layers")
SMOLLM2_FULL_LAYERS = "5,14-21,23-24,28-29"


def layer_set(text: str) -> frozenset[int] | None:
    """``'14,17-18'`` -> ``{14, 17, 18}`` (``''``: none); None when ``text`` is not such a list."""
    out = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
            return None
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def layer_config(cfg, layer: int):
    """The config (a ``MacConfig`` or ``MacDecodeConfig``) layer ``layer`` runs: ``reuse`` off in
    ``cfg.full_layers``."""
    return replace(cfg, reuse=False) if layer in layer_set(cfg.full_layers) else cfg


@dataclass(frozen=True)
class MacConfig(BlockConfig):
    window: int = param(512, "M: ring window of past pre-RoPE queries per query head")
    tau: float = param(0.45, "match threshold: hit iff ||q_pre_n - q_pre_m|| < sqrt(2d)(1 - tau)")
    band: int = param(256, "S: an entry of position p covers keys [sinks, p+1-S); the last S keys are the tail "
                           "(the rectification distance; 0: no amend, the entry covers [sinks, p+1))")
    min_context: int = param(2048, "MAC is attempted only when the step sees at least this many keys")
    sinks: int = param(4, "F: the first F keys are always recomputed exactly with the current query")
    cancel_bound: float = param(1.0 / 64, "a removal is flagged (full recompute) when 1 - t < this")
    reuse: bool = param(True, "ablation: False makes every step a miss (full attention, entries still kept)")
    exact_prefix: bool = param(False, "ablation: on a hit recompute the prefix with the current query")
    full_layers: str = param(SMOLLM2_FULL_LAYERS, "layers whose steps all miss (full attention; entries still "
                             "kept), e.g. '14,17-18'; the default: SmolLM2-135M's costliest ('' : reuse everywhere)")

    def validate(self):
        self.require(self.window >= 1, f"window must be >= 1, got {self.window}")
        self.require(0.0 < self.tau < 1.0, f"tau must be in (0, 1), got {self.tau}")
        self.require(self.band >= 0, f"band must be >= 0, got {self.band}")
        self.require(self.min_context >= 1, f"min_context must be >= 1, got {self.min_context}")
        self.require(self.sinks >= 0, f"sinks must be >= 0, got {self.sinks}")
        self.require(0.0 < self.cancel_bound < 1.0, f"cancel_bound must be in (0, 1), got {self.cancel_bound}")
        self.require(layer_set(self.full_layers) is not None,
                     f"full_layers must be layer numbers and ranges like '3,5-7', got {self.full_layers!r}")

    def threshold(self, head_dim: int) -> float:
        return math.sqrt(2 * head_dim) * (1 - self.tau)


# -- pure state algebra -----------------------------------------------------------------------
def empty_state(shape, d: int, dtype=torch.float64):
    """The state over no keys: ``o = 0``, ``lse = -inf`` (neutral for ⊕)."""
    return torch.zeros(*shape, d, dtype=dtype), torch.full(tuple(shape), NEG_INF, dtype=dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """State ``(o, lse)`` of queries ``q (..., d)`` over keys ``k, v (..., L, d)``; L = 0 gives the empty state."""
    if k.shape[-2] == 0:
        return empty_state(q.shape[:-1], v.shape[-1], q.dtype)
    s = (k @ q.unsqueeze(-1)).squeeze(-1) * scale
    lse = torch.logsumexp(s, -1)
    o = (torch.exp(s - lse.unsqueeze(-1)).unsqueeze(-2) @ v).squeeze(-2)
    return o, lse


def merge_states(o1, lse1, o2, lse2):
    """⊕: the state over the union of two disjoint key sets."""
    lse = torch.logaddexp(lse1, lse2)
    fin = torch.isfinite(lse)
    safe = torch.where(fin, lse, torch.zeros_like(lse))
    w1 = torch.where(fin, torch.exp(lse1 - safe), torch.zeros_like(lse))
    w2 = torch.where(fin, torch.exp(lse2 - safe), torch.zeros_like(lse))
    return w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2, lse


def downdate_states(o1, lse1, o2, lse2, cancel_bound: float = 1.0 / 64):
    """⊖: remove state 2 (a subset of state 1's keys) from state 1.

    Returns ``(o, lse, cancelled)``; where ``1 - t < cancel_bound`` (t = exp(l2 - l1)) or the
    inputs are not finite, ``cancelled`` is True and ``o = 0, lse = -inf`` (the caller must
    recompute). Removing the empty state returns state 1 unchanged."""
    t = torch.exp(lse2 - lse1)
    one_minus_t = 1 - t
    cancelled = ~(one_minus_t >= cancel_bound) | ~torch.isfinite(lse1)
    safe = torch.where(cancelled, torch.ones_like(one_minus_t), one_minus_t)
    lse = torch.where(cancelled, torch.full_like(lse1, NEG_INF), lse1 + torch.log(safe))
    o = (o1 - t.unsqueeze(-1) * o2) / safe.unsqueeze(-1)
    o = torch.where(cancelled.unsqueeze(-1), torch.zeros_like(o), o)
    return o, lse, cancelled


TIE_TOLERANCE = 1e-6   # relative: far above float32 rounding of q (~1e-7), far below real gaps


def match(ring_q: torch.Tensor, ring_pos: torch.Tensor, valid: torch.Tensor, q: torch.Tensor, threshold: float):
    """Best match per query head. ``ring_q (H, M, d)``, ``ring_pos (M,)`` (-1 empty), ``valid (H, M)``
    (an entry exists), ``q (H, d)``. Returns ``(hit (H,), pos (H,), dist (H,))``: minimum L2 distance
    over usable slots, ties to the lower position; pos = -1 when nothing is usable.

    Distances within a relative ``TIE_TOLERANCE`` of the minimum tie: a token that repeats has the
    same pre-RoPE query in layer 0, but a prefill's GEMM and a decode step's GEMV round it
    differently (float32: ~1e-7), and the choice between the two entries then followed the
    machine's kernels and thread count (perplexity moved 3.4 % on 24 tokens between 1 and 2
    threads). The bit-accurate match sees those queries equal after quantization."""
    usable = valid & (ring_pos >= 0).unsqueeze(0)
    dist = (ring_q - q.unsqueeze(1)).norm(dim=-1)
    dist = torch.where(usable, dist, torch.full_like(dist, math.inf))
    best_d = dist.min(-1).values
    # among the slots at the minimum distance, the lowest position
    tied = (dist <= best_d.unsqueeze(-1) * (1 + TIE_TOLERANCE)) & torch.isfinite(dist)
    key = torch.where(tied, ring_pos.unsqueeze(0).expand_as(dist), torch.full_like(dist, 1 << 62, dtype=torch.long))
    best = key.argmin(-1)
    pos = torch.where(torch.isfinite(best_d), ring_pos[best], torch.full_like(best, -1))
    hit = torch.isfinite(best_d) & (best_d < threshold)
    return hit, pos, best_d


class MacLayerState:
    """MAC state of one layer: ring of pre-RoPE queries and downdated ``(O, LSE)`` entries per query head."""

    def __init__(self, cfg: MacConfig, q_heads: int, kv_heads: int, head_dim: int, scale: float | None = None):
        if q_heads % kv_heads:
            raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
        self.cfg, self.hq, self.hkv, self.d = cfg, q_heads, kv_heads, head_dim
        self.scale = scale if scale is not None else head_dim ** -0.5
        M = cfg.window
        self.ring_q = torch.zeros(q_heads, M, head_dim, dtype=torch.float64)
        self.ring_pos = torch.full((M,), -1, dtype=torch.long)
        self.entry_o = torch.zeros(q_heads, M, head_dim, dtype=torch.float64)
        self.entry_lse = torch.full((q_heads, M), NEG_INF, dtype=torch.float64)
        self.entry_valid = torch.zeros(q_heads, M, dtype=torch.bool)

    def _write(self, position: int, q_pre: torch.Tensor, o, lse, valid) -> None:
        slot = position % self.cfg.window
        self.ring_pos[slot] = position
        self.ring_q[:, slot] = q_pre
        self.entry_o[:, slot] = o
        self.entry_lse[:, slot] = lse
        self.entry_valid[:, slot] = valid

    def _scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scores of query heads ``q (Hq, ..., d)`` against their group's keys ``k (Hkv, L, d)``: ``(Hq, ..., L)``."""
        qg = q.double().reshape(self.hkv, -1, self.d)
        return (qg @ k.double().transpose(1, 2)).reshape(self.hq, *q.shape[1:-1], k.shape[1]) * self.scale

    def _range_state(self, s: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        """State over keys ``[lo, hi)`` (per query head, broadcast over s's middle dims) from scores
        ``s (Hq, ..., L)`` and values ``v (Hkv, L, d)``; an empty range gives the empty state."""
        idx = torch.arange(s.shape[-1])
        mask = (idx >= lo.unsqueeze(-1)) & (idx < hi.unsqueeze(-1))
        sm = s.masked_fill(~mask, NEG_INF)
        lse = torch.logsumexp(sm, -1)
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        w = torch.exp(sm - safe.unsqueeze(-1))                      # 0 where masked
        o = w.reshape(self.hkv, -1, s.shape[-1]) @ v.double()
        return o.reshape(*s.shape[:-1], self.d), lse

    def prefill(self, q_pre: torch.Tensor, q_post: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Fill the ring from a prefill of positions ``0..P-1`` (``q_* (Hq, P, d)``, ``k, v (Hkv, P, d)``):
        entries of the last ``window`` positions, computed exactly over ``[sinks, p+1-S)``."""
        cfg, P = self.cfg, q_pre.shape[1]
        first = max(0, P - cfg.window)
        pos = torch.arange(first, P)
        hi = (pos + 1 - cfg.band).clamp_min(cfg.sinks)
        top = int(hi.max()) if pos.numel() else 0                        # keys [0, top) suffice
        o = torch.zeros(self.hq, pos.numel(), self.d, dtype=torch.float64)
        lse = torch.full((self.hq, pos.numel()), NEG_INF, dtype=torch.float64)
        for c in range(0, pos.numel() if top > 0 else 0, 128):           # chunks bound the score matrix
            sl = slice(c, c + 128)
            s = self._scores(q_post[:, first:][:, sl], k[:, :top])       # (Hq, chunk, top)
            lo = torch.full((self.hq, s.shape[1]), cfg.sinks, dtype=torch.long)
            o[:, sl], lse[:, sl] = self._range_state(s, v[:, :top], lo, hi[sl].expand(self.hq, -1))
        slots = pos % cfg.window
        self.ring_pos[slots] = pos
        self.ring_q[:, slots] = q_pre[:, first:].double()
        self.entry_o[:, slots] = o
        self.entry_lse[:, slots] = lse
        self.entry_valid[:, slots] = True

    def decode_step(self, q_pre: torch.Tensor, q_post: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    position: int):
        """Output ``(Hq, d)`` of position ``n = position`` given ``q_pre, q_post (Hq, d)`` and the whole
        cache ``k, v (Hkv, n+1, d)``, and the step's stats. All query heads are processed at once;
        per head, a hit uses entry(m) ⊕ band and a miss uses full ⊖ tail as the new entry."""
        cfg, n, d, H = self.cfg, position, self.d, self.hq
        L = k.shape[1]
        if L != n + 1:
            raise ValueError(f"decode_step at position {n} needs {n + 1} keys, got {L}")
        g = H // self.hkv
        q_pre = q_pre.double()
        F, S = cfg.sinks, cfg.band
        lo_tail = max(F, n + 1 - S)
        engaged = cfg.reuse and L >= cfg.min_context
        if engaged:
            hit, mpos, _ = match(self.ring_q, self.ring_pos, self.entry_valid, q_pre, cfg.threshold(d))
        else:
            hit, mpos = torch.zeros(H, dtype=torch.bool), torch.full((H,), -1, dtype=torch.long)
        s = self._scores(q_post.reshape(H, d), k)                         # (Hq, L)
        full = lambda x: torch.full((H,), x, dtype=torch.long)  # noqa: E731
        sink = self._range_state(s, v, full(0), full(F))
        tail = self._range_state(s, v, full(lo_tail), full(L))
        # hit path: entry(m) (prefix [F, m+1-S) with Q_m) ⊕ band [m+1-S, n+1-S) with Q_n
        lo_band = (mpos + 1 - S).clamp(min=F, max=lo_tail)
        slot = mpos.clamp_min(0) % cfg.window
        if cfg.exact_prefix:
            pre = self._range_state(s, v, full(F), lo_band)
        else:
            pre = (self.entry_o[torch.arange(H), slot], self.entry_lse[torch.arange(H), slot])
        band = self._range_state(s, v, lo_band, full(lo_tail))
        hit_o, hit_l = merge_states(*pre, *band)
        # miss path: full attention; entry = body ⊖ tail, recomputed exactly where that cancels
        body = self._range_state(s, v, full(F), full(L))
        miss_o, miss_l, canc = downdate_states(*body, *tail, cfg.cancel_bound)
        if lo_tail == F:                                                  # nothing before the tail
            miss_o, miss_l = empty_state((H,), d)
            canc = torch.zeros(H, dtype=torch.bool)
        fb = canc & ~hit
        if bool(fb.any()):
            exact_o, exact_l = self._range_state(s, v, full(F), full(lo_tail))
            miss_o = torch.where(canc.unsqueeze(-1), exact_o, miss_o)
            miss_l = torch.where(canc, exact_l, miss_l)
        entry_o = torch.where(hit.unsqueeze(-1), hit_o, miss_o)
        entry_l = torch.where(hit, hit_l, miss_l)
        self._write(n, q_pre, entry_o, entry_l, torch.ones(H, dtype=torch.bool))  # before the tail merge
        o, lse = merge_states(entry_o, entry_l, *tail)                     # prefix ⊕ band ⊕ tail
        out, _ = merge_states(*sink, o, lse)
        # GQA: a KV group skips reads only if all its query heads hit (then it reads the union)
        read = torch.where(hit, F + (L - lo_band), full(L))
        group_read = torch.where(hit.view(self.hkv, g).all(1), read.view(self.hkv, g).max(1).values,
                                 torch.full((self.hkv,), L, dtype=torch.long))
        stats = {"engaged": bool(engaged), "hits": int(hit.sum()), "misses": int(H - hit.sum()) if engaged else 0,
                 "heads": H, "fallbacks": int(fb.sum()), "kv_read": int(group_read.sum()),
                 "head_kv_read": int(read.sum()), "head_kv_total": int(H * L),  # each query head's own keys
                 "kv_total": int(self.hkv * L),
                 "skip_ratio": 1.0 - float(group_read.sum()) / float(self.hkv * L)}
        return out, stats
