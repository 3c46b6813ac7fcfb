"""AttnCache's runtime (docs/algorithms.md section 3): :class:`AttnCache` plugs a store into one
transformers model through its public extension points only, and no library function or forward
is replaced:

* ``AttentionInterface``/``AttentionMaskInterface``: :func:`_attncache_attention` is registered
  under ``ATTN_NAME`` and chosen with ``model.set_attn_implementation``; on a hit the reused layers
  (``layers``) multiply the stored map with V, QK^T and softmax are skipped.
* PyTorch forward (pre-)hooks on the model (per-forward state, the 2-D mask's lengths), on layer 0's
  attention (the lookup, from its input) and on every attention module (its time, the rotary
  ``position_embeddings`` it is given).
* forward pre-hooks and hooks on each reused layer's q and k projections: on a hit the pre-hook
  hands the projection only the rows whose q (k) is read and the hook scatters them back (zeros in
  the reused rows); when no row of q (k) is read, the hook returns a one-head placeholder, so the
  modeling code's RoPE rotates one unread head instead of every head. A prefix hit (rows 0..P-1
  reused) projects q for rows P.. only, rotates them in the attention function with the layer's
  ``position_embeddings`` and the modeling module's own ``rotate_half``, and projects k for every row.

Lookups are batched: a batch of B inputs (right-padded) is pooled, projected and searched at
once; hit rows reuse, miss rows compute attention as usual. A hit's keys are not computed: the
KV cache of a hitting forward serves no later decoding step.
"""
from __future__ import annotations

import sys
import time
import weakref
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DataError
from .config import AttnCacheConfig
from .projector import pool_input
from .store import MapStore

ATTN_NAME = "ladmac_attncache"
# which AttnCache serves an attention module (read by the registered attention function)
_SERVING: weakref.WeakKeyDictionary[nn.Module, "AttnCache"] = weakref.WeakKeyDictionary()


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    mods = [m for m in model.modules()
            if hasattr(m, "layer_idx") and m.layer_idx is not None
            and (hasattr(m, "q_proj") or hasattr(m, "query"))]
    if not mods:
        raise ValueError("no attention modules with layer_idx and q_proj/query found in the model")
    return sorted(mods, key=lambda m: m.layer_idx)


class AttnCache:
    """Runtime attached to one transformers model. Modes: ``off`` (full model, sdpa), ``record``
    (eager maps kept in ``recorded``), ``lookup`` (search; on a hit reuse stored maps in the
    store's layers), ``force`` (reuse the nearest equal-length candidate whatever its similarity).
    Batches are right-padded (lengths from the model call's 2-D ``attention_mask``); hit rows reuse,
    miss rows compute. Per forward: ``last`` holds hit, entry, sim of row 0, ``rows`` (per row:
    hit, entry, sim) and times (attention, lookup). Attaches on construction (a cache already
    attached to the model is detached first); :meth:`detach` undoes it."""

    def __init__(self, model: nn.Module, cfg: AttnCacheConfig | None = None):
        self.model = model
        self.cfg = cfg or AttnCacheConfig()
        self.mode = "off"
        self.store: MapStore | None = None
        self.theta = self.cfg.theta
        self.hit_maps: dict[int, torch.Tensor] | None = None
        self.hit_rows: torch.Tensor | None = None
        self.all_hit = False
        self.lengths: list[int] | None = None
        self.input_ids: torch.Tensor | None = None
        self.rows_reused = 0  # prefix hit: rows 0..rows_reused-1 reuse the map, the rest compute; 0: all rows
        self.recorded: list[torch.Tensor] = []
        self.pooled: torch.Tensor | None = None
        self.last: dict = {}
        self._attn_t0 = 0.0
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # this layer's (cos, sin)
        self._projected_rows: torch.Size | None = None  # (B, L) of the projection being skipped
        self._query_rows: torch.Tensor | None = None  # a prefix hit's q, rows P.., unrotated
        self._handles = []
        self.attn_modules = _attention_modules(model)
        modeling = sys.modules.get(type(self.attn_modules[0]).__module__)
        self._rotate_half = getattr(modeling, "rotate_half", None)
        self.num_layers = len(self.attn_modules)
        self._attach()

    # -- wiring ----------------------------------------------------------------------------
    def _attach(self):
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        for other in {_SERVING.get(mod) for mod in self.attn_modules} - {None}:
            other.detach()  # one cache per model
        AttentionInterface.register(ATTN_NAME, _attncache_attention)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        self._prev_impl = self.model.config._attn_implementation
        self.model.set_attn_implementation(ATTN_NAME)
        for mod in self.attn_modules:
            _SERVING[mod] = self
            names = ("q_proj", "k_proj") if hasattr(mod, "q_proj") else ("query", "key")
            for name, is_query in zip(names, (True, False)):
                where = dict(layer=mod.layer_idx, is_query=is_query, head_dim=_head_dim(mod))
                linear = getattr(mod, name)
                self._handles.append(linear.register_forward_pre_hook(partial(self._projection_pre, **where)))
                self._handles.append(linear.register_forward_hook(partial(self._projection_post, **where)))
            self._handles.append(mod.register_forward_pre_hook(self._attn_pre, with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._attn_post))
        self._handles.append(self.attn_modules[0].register_forward_pre_hook(self._layer0_pre, with_kwargs=True,
                                                                              prepend=True))
        self._handles.append(self.model.register_forward_pre_hook(self._model_pre, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._model_post))

    def detach(self):
        """Remove every hook and give the model back its previous attention implementation (once)."""
        if not self._handles:
            return
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for mod in self.attn_modules:
            if _SERVING.get(mod) is self:
                del _SERVING[mod]
        self.model.set_attn_implementation(self._prev_impl)

    def use_store(self, store: MapStore, theta: float | None = None):
        if store.layers and max(store.layers) >= self.num_layers:
            raise DataError(f"AttnCache store {store.root} holds layer {max(store.layers)}; "
                            f"the model has {self.num_layers}")
        self.store = store
        self.theta = store.cfg.theta if theta is None else theta

    # -- per layer state -------------------------------------------------------------------
    def reusing(self, layer: int):
        """None: layer computes; True: every row reuses (Q/K skipped); else the bool hit-row mask."""
        if self.hit_maps is None or layer not in self.hit_maps:
            return None
        return True if self.all_hit else self.hit_rows

    # -- hooks -----------------------------------------------------------------------------
    def _model_pre(self, module, args, kwargs):
        self.hit_maps, self.hit_rows, self.all_hit, self.recorded, self.pooled = None, None, False, [], None
        self.rows_reused = 0
        self.last = {"hit": False, "entry": -1, "sim": float("-inf"), "attn_s": 0.0, "lookup_s": 0.0,
                     "fetch_s": 0.0, "rows": [], "rows_reused": 0}
        self.input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.lengths = None
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and self.mode != "off":
            m = mask.bool()
            lengths = m.sum(1)
            expect = torch.arange(m.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
            if not torch.equal(m, expect):
                raise ValueError("AttnCache batches must be right-padded (padding_side='right')")
            self.lengths = [int(x) for x in lengths]

    def _model_post(self, module, args, output):
        self.hit_maps, self.hit_rows, self.all_hit, self.rows_reused = None, None, False, 0
        self._query_rows = self._rope = None

    def _layer0_pre(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if self.mode == "off":
            return None
        t0 = time.perf_counter()
        bsz, seq = hidden.shape[0], hidden.shape[1]
        lengths = self.lengths if self.lengths is not None else [seq] * bsz
        if self.mode == "lookup" and self.store is not None and self.store.kind == "prefix":
            return self._prefix_lookup(bsz, seq, lengths, t0)
        cfg = self.cfg if self.store is None else self.store.cfg
        self.pooled = torch.cat([pool_input(hidden[b, :lengths[b]], cfg) for b in range(bsz)])
        if self.mode in ("lookup", "force"):
            if self.store is None:
                raise ValueError("AttnCache lookup needs a store (use_store)")
            entries, sims = self.store.search_batch(self.store.features(self.pooled), lengths)
            hits = (entries >= 0) & ((self.mode == "force") | (sims >= self.theta))
            self.last["rows"] = [{"hit": bool(h), "entry": int(e), "sim": float(s)}
                                 for h, e, s in zip(hits, entries, sims)]
            self.last.update(self.last["rows"][0])
            if hits.any():
                t1 = time.perf_counter()
                fetched = {b: self.store.fetch(int(entries[b])) for b in np.nonzero(hits)[0]}
                self.last["fetch_s"] += time.perf_counter() - t1
                t0 += time.perf_counter() - t1  # lookup_s excludes the fetch
                self.all_hit = bool(hits.all())
                self.hit_rows = torch.as_tensor(hits)
                self.hit_maps = {}
                for layer in self.store.layers:
                    if bsz == 1:
                        self.hit_maps[layer] = fetched[0][layer]  # the mapped file itself, no copy
                        continue
                    heads = self.store.heads
                    out = torch.zeros(bsz, heads, seq, seq)
                    for b, maps in fetched.items():
                        n = lengths[b]
                        out[b, :, :n, :n] = maps[layer][0]
                    self.hit_maps[layer] = out
        self.last["lookup_s"] += time.perf_counter() - t0
        return None

    def _prefix_lookup(self, bsz, seq, lengths, t0):
        """Prefix store: the stored entry whose token ids start this input; its map serves rows 0..P-1
        exactly (causal attention: those rows see tokens 0..P-1 only), rows P.. compute."""
        if bsz != 1:
            raise ValueError("AttnCache prefix stores take one input at a time (batch 1)")
        if not isinstance(self.input_ids, torch.Tensor):
            raise ValueError("AttnCache prefix stores need the model called with input_ids")
        entry = self.store.match_prefix(self.input_ids[0, :lengths[0]])
        self.last["lookup_s"] += time.perf_counter() - t0
        self.last["rows"] = [{"hit": entry >= 0, "entry": entry, "sim": 1.0 if entry >= 0 else float("-inf")}]
        self.last.update(self.last["rows"][0])
        if entry >= 0:
            t1 = time.perf_counter()
            self.hit_maps = self.store.fetch(entry)
            self.last["fetch_s"] += time.perf_counter() - t1
            reused = int(self.store.lengths[entry])
            self.all_hit = True
            self.hit_rows = torch.ones(1, dtype=torch.bool)
            self.rows_reused = 0 if reused == seq else reused
            self.last["rows_reused"] = reused
        return None

    def _attn_pre(self, module, args, kwargs):
        self._rope = kwargs.get("position_embeddings")
        self._attn_t0 = time.perf_counter()

    def _attn_post(self, module, args, output):
        self.last["attn_s"] += time.perf_counter() - self._attn_t0

    def _skipping(self, layer: int, is_query: bool):
        """The rows of ``layer``'s q (k) projection that are not computed: None (every row computes),
        True (no row: every row reuses; a prefix hit's q: rows 0..P-1) or the bool hit-row mask. A
        prefix hit computes every row of k: rows P.. attend to all keys."""
        rows = self.reusing(layer)
        if rows is True and self.rows_reused and not is_query:
            return None
        return rows

    def _projection_pre(self, linear, args, *, layer, is_query, head_dim):
        """Forward pre-hook of a q/k projection: it receives only the rows whose output is read."""
        rows = self._skipping(layer, is_query)
        if rows is None:
            return None
        x = args[0]
        self._projected_rows = x.shape[:-1]
        if rows is True:
            return (x[:, self.rows_reused:] if self.rows_reused else x[:, :0],)
        return (x[~rows],)

    def _projection_post(self, linear, args, out, *, layer, is_query, head_dim):
        """Forward hook of a q/k projection: the computed rows back in place (zeros in the reused
        rows), or, when no row of its output is read, a one-head placeholder (never read; a prefix
        hit's q rows P.. are kept for the attention function, which rotates them)."""
        rows = self._skipping(layer, is_query)
        if rows is None:
            return None
        if rows is True:
            if is_query and self.rows_reused:
                self._query_rows = out
            return out.new_empty(*self._projected_rows, head_dim)
        full = out.new_zeros(*self._projected_rows, linear.out_features)
        full[~rows] = out
        return full

    def rotated_query_rows(self, head_dim: int) -> torch.Tensor:
        """A prefix hit's q for rows P.. as (B, Hq, L-P, D), rotated with the layer's
        ``position_embeddings`` by the modeling module's formula ``x * cos + rotate_half(x) * sin``."""
        q = self._query_rows
        q = q.view(*q.shape[:-1], -1, head_dim).transpose(1, 2)
        if self._rope is None:
            return q
        if self._rotate_half is None:
            raise ValueError("AttnCache prefix stores need the modeling module's rotate_half")
        p = self.rows_reused
        cos, sin = (t.unsqueeze(1)[:, :, p:] for t in self._rope)
        return q * cos + self._rotate_half(q) * sin


def _head_dim(attention: nn.Module) -> int:
    """Width of one head of a transformers attention module (Llama: head_dim; BERT: attention_head_size)."""
    return getattr(attention, "head_dim", None) or attention.attention_head_size


def _causal_or_given(scores, attention_mask, module):
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : scores.shape[-1]]
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask
    if getattr(module, "is_causal", False):
        q_len, k_len = scores.shape[-2:]
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        return scores.masked_fill(~causal, float("-inf"))
    return scores


def _reuse_matmul(amap, value):
    """(B, Hq, L, L) map @ (B, Hkv, L, D) values (GQA: Hq = g * Hkv) -> (B, L, Hq, D)."""
    bsz, h_kv, length, dim = value.shape
    h_q = amap.shape[1]
    out = torch.matmul(amap.view(bsz, h_kv, h_q // h_kv, length, length), value.unsqueeze(2))
    return out.view(bsz, h_q, length, dim).transpose(1, 2)


def _prefix_attention(amap, query_rows, key, value, attention_mask, scaling, blocks: int = 4):
    """Batch 1, rows 0..P-1 from the stored (1, Hq, P, P) causal map (row blocks: block i multiplies
    only the columns up to its last row, the map being zero above the diagonal), rows P.. by sdpa of
    ``query_rows`` (rotated q of rows P..) over all keys (causal). -> (1, L, Hq, D)"""
    bsz, h_kv, length, dim = value.shape
    h_q, p = amap.shape[1], amap.shape[-1]
    a = amap.view(bsz, h_kv, h_q // h_kv, p, p)
    v = value[:, :, :p].unsqueeze(2)
    step = max(64, -(-p // blocks))
    head = torch.cat([torch.matmul(a[..., s:min(p, s + step), :min(p, s + step)], v[..., :min(p, s + step), :])
                      for s in range(0, p, step)], dim=-2).view(bsz, h_q, p, dim)
    if attention_mask is not None:
        mask = attention_mask[:, :, p:, :length]
    else:
        mask = torch.ones(length - p, length, dtype=torch.bool).tril(p)
    tail = F.scaled_dot_product_attention(query_rows, key, value, attn_mask=mask, scale=scaling,
                                          enable_gqa=h_q != h_kv)
    return torch.cat([head, tail], dim=2).transpose(1, 2).contiguous()


def _attncache_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function: stored map @ V on hit rows of a reused layer, eager maps when
    recording, else sdpa (miss rows of a partly hitting batch: sdpa on those rows only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    cache = _SERVING.get(module)
    rows = cache.reusing(module.layer_idx) if cache is not None else None
    if rows is not None:
        amap = cache.hit_maps[module.layer_idx]
        if rows is True and cache.rows_reused:
            query_rows = cache.rotated_query_rows(value.shape[-1])
            return _prefix_attention(amap, query_rows, key, value, attention_mask, scaling), None
        if amap.shape[-1] != value.shape[2]:
            raise ValueError(f"stored map length {amap.shape[-1]} != input length {value.shape[2]}")
        if rows is True:
            return _reuse_matmul(amap, value).contiguous(), None
        bsz, length, h_q, dim = value.shape[0], value.shape[2], amap.shape[1], value.shape[3]
        out = value.new_empty(bsz, length, h_q, dim)
        out[rows] = _reuse_matmul(amap[rows], value[rows])
        miss = ~rows
        mask = attention_mask[miss] if attention_mask is not None else None
        sub, _ = sdpa_attention_forward(module, query[miss], key[miss], value[miss], mask, dropout=dropout,
                                        scaling=scaling, **kwargs)
        out[miss] = sub
        return out, None
    if cache is not None and cache.mode == "record":
        groups = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = _causal_or_given(torch.matmul(query, k.transpose(2, 3)) * scale, attention_mask, module)
        amap = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        cache.recorded.append(amap.detach())
        return torch.matmul(amap, v).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)
