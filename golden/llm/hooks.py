"""LAD and MAC plugged into a transformers decoder through its attention interface.

A :class:`Controller` belongs to one model: it registers its bound method :meth:`Controller.attention`
with ``transformers.AttentionInterface`` (and sdpa's mask with ``AttentionMaskInterface``) under a
name of its own, switches the model to that implementation and keeps a forward hook on every
layer's ``q_proj`` (MAC matches pre-RoPE queries, which the attention interface never sees).
Everything a run needs (which method, its configs, per-layer states, stats) lives on the
controller; nothing is module-global and no transformers function is replaced.

Per-layer states: :class:`golden.lad_ref.LadHead` (``lad``), :class:`TileLayerState` (``lad-tile``,
the LAD tile's bit-accurate model), :class:`golden.mac_ref.MacLayerState` (``mac``) and
:class:`golden.mac_decode.MacDecodeLayer` (``mac-decode``, the MAC decode engine's bit-accurate model).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import replace

import torch

from ..dense import dense_step_cycles
from ..errors import ConfigError
from ..lad_ref import LadConfig, LadHead
from ..lad_batch import LadTileBatch
from ..lad_tile import LadTileConfig, StepPath, schedule_cycles
from ..mac_decode import MacDecodeConfig, MacDecodeLayer
from ..mac_ref import MacConfig, MacLayerState, layer_config

METHODS = ("full", "lad", "lad-tile", "mac", "mac-decode")
_CONTROLLERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> its attached Controller


def controller_of(model) -> "Controller | None":
    """The :class:`Controller` attached to ``model``, if any (one at a time: attaching detaches the last)."""
    return _CONTROLLERS.get(model)


class TileLayerState:
    """One layer's query heads on the LAD tile's bit-accurate model (one tile per query head; GQA
    heads read their group's k, v), all heads advanced together by ``golden.lad_batch.LadTileBatch``
    (bit-exact with one ``LadTileModel`` per head: testbenches/test_lad_batch.py): float q, k, v are
    quantized to the tile's kv format (saturating; saturated elements are counted), ``o`` comes
    back as float. A step is exactly what the RTL computes for each head."""

    def __init__(self, cfg: LadTileConfig, heads: int, scale: float, kv_group: int = 1):
        if abs(scale * math.sqrt(cfg.head_dim) - 1) > 1e-6:
            raise ConfigError(f"the LAD tile scales scores by 1/sqrt(head_dim); the model uses {scale}")
        if kv_group % cfg.group:
            raise ConfigError(f"a tile's group ({cfg.group} query heads) must divide the model's query heads "
                              f"per KV head ({kv_group}): only those share their keys")
        self.cfg = cfg
        self.tiles = LadTileBatch(cfg, heads)
        self.heads = heads
        self.saturated = 0

    @property
    def length(self) -> int:
        return self.tiles.n

    @property
    def n_centers(self) -> torch.Tensor:
        return self.tiles.n_centers.clone()

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """``q, k, v (heads, d)`` float -> ``o (heads, d)`` float and the step's stats summed over
        heads, with the float reference's keys (``keys_read`` counts candidates plus the new key)."""
        f = self.cfg.kv_format
        raw = [f.quantize(t) for t in (q, k, v)]
        hi, lo = (1 << (f.width - 1)) - 1, -(1 << (f.width - 1))
        sat = sum(int(((r == hi) | (r == lo)).sum()) for r in raw)
        self.saturated += sat
        o, st = self.tiles.step(*raw)
        if bool((st["path"] == StepPath.BEYOND).any()):
            raise ConfigError(f"context exceeds the tile's KV memory (kv_positions = {self.cfg.kv_positions})")
        exact = int((st["path"] == StepPath.EXACT).sum())     # past max_positions: every key and value read
        tot = {key: int(st[key].sum()) for key in
               ("candidates", "active", "false_alarms", "mode_changes", "centers", "kv_beats")}
        # keys and values read: one KV stream per tile (a group of cfg.group heads reads each position
        # once for all of them), the new position's included; an exact pass reads every position
        g = self.cfg.group
        readers = self.heads // g
        if g > 1:   # the KV port's beats: a group's tile reads a candidate's key, an active's value once
            lad_step = st["path"] == StepPath.LAD                  # (an exact pass: every key and value once)
            tot["kv_beats"] = (self.cfg.beats * int(((st["group_candidates"] + st["group_active"]) * lad_step).sum())
                               + int(st["kv_beats"][~lad_step].sum())) // g
        # a step whose Z is clamped to 0 before RECIP returns a saturated o (docs/lad-tile.md, "Z <= 0"): counted
        z_clamped = int(((st["z"] <= 0) & (st["path"] == StepPath.LAD)).sum())
        tot.update(heads=self.heads, readers=readers, saturated=sat, z_clamped=z_clamped,
                   positions=self.length, exact_steps=exact,
                   keys_read=int(st["group_candidates"].sum()) // g + readers + exact // g * (self.length - 1),
                   values_read=int(st["group_active"].sum()) // g + readers + exact // g * (self.length - 1))
        # cycles: the schedule's model per head (validated on the RTL by benchmarks/lad_vs_dense.py);
        # an exact pass and the dense baseline read every key and value, 2 n beats each
        # a group's tile: one step per group (golden.lad_tile.schedule_cycles), its heads' shared
        # statistics from the group's first head, the KV beats of the union, the busiest head's mode
        # changes; against the group-aware dense tile
        n = self.length - 1                                     # positions before this step
        dense = dense_step_cycles(self.cfg, n + 1)
        per_group = {key: st[key].view(readers, g) for key in ("centers", "new_center", "mode_changes", "path")}
        # (with g = 1 the union is the head's own candidates and actives: its kv_beats on a LAD step)
        kv_beats = self.cfg.beats * (st["group_candidates"] + st["group_active"]).view(readers, g)[:, 0]
        lad = schedule_cycles(self.cfg, n, (per_group["centers"] - per_group["new_center"])[:, 0], kv_beats,
                              per_group["mode_changes"].max(1).values, per_group["new_center"][:, 0])
        lad = torch.where((per_group["path"] == StepPath.LAD).all(1), lad, float(dense))
        tot.update(tile_cycles=float(lad.sum()), dense_cycles=float(dense * readers))
        return f.to_float(o), tot


class Controller:
    """Which attention runs inside ``model``, its per-layer states, the captured pre-RoPE queries
    and the run's stats. ``lad_head`` builds the ``lad`` method's per-layer state (a subclass of
    :class:`LadHead` for ablations). Attaches on construction; :meth:`detach` undoes it."""

    def __init__(self, model, lad_head: type[LadHead] = LadHead):
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        previous = controller_of(model)
        if previous is not None:
            previous.detach()
        self.model = model
        self.lad_head = lad_head
        self.name = f"ladmac_decode_{id(self):x}"
        self.start("full")
        AttentionInterface.register(self.name, self.attention)
        AttentionMaskInterface.register(self.name, sdpa_mask)
        self._previous_impl = model.config._attn_implementation
        model.set_attn_implementation(self.name)
        self._hooks = []
        for i, layer in enumerate(model.model.layers):
            def keep_q_pre(mod, inp, out, i=i):
                self.q_pre[i] = out[0].detach()
            self._hooks.append(layer.self_attn.q_proj.register_forward_hook(keep_q_pre))
        _CONTROLLERS[model] = self

    def detach(self) -> None:
        """Remove the hooks and give the model back its previous attention implementation."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if controller_of(self.model) is self:
            self.model.set_attn_implementation(self._previous_impl)
            del _CONTROLLERS[self.model]

    # -- a run ---------------------------------------------------------------------------------
    def start(self, method: str, lad: LadConfig | None = None, mac: MacConfig | MacDecodeConfig | None = None,
              tile: LadTileConfig | None = None) -> "Controller":
        """Begin a run of ``method`` (full | lad | lad-tile | mac | mac-decode): fresh states and stats
        (``mac``: a MacConfig for ``mac``, a MacDecodeConfig for ``mac-decode``)."""
        if method not in METHODS:
            raise ConfigError(f"unknown attention method '{method}' (known: {', '.join(METHODS)})")
        self.method = method
        self.lad = lad or LadConfig()
        self.mac = mac or (MacDecodeConfig() if method == "mac-decode" else MacConfig())
        if method == "mac-decode" and not isinstance(self.mac, MacDecodeConfig):
            raise ConfigError("mac-decode runs on a MacDecodeConfig")
        self.tile = tile or LadTileConfig()
        self.prefill_bar = None      # a tqdm bar the tile's decode of a prefill advances (positions x layers)
        self.totals, self.steps, self.layer_steps = {}, [], []
        self.reset()
        return self

    def reset(self) -> None:
        """Forget the per-layer states (a new sequence), keep the run's stats."""
        self.states, self.q_pre, self._step, self._layers = {}, {}, {}, {}

    def add(self, stats: dict, layer: int) -> None:
        """Count one layer's step: its numeric stats (summed over the layer's query heads)."""
        counts = {k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._layers[layer] = counts
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + v
            self._step[k] = self._step.get(k, 0) + v
        self.totals["layer_steps"] = self.totals.get("layer_steps", 0) + 1
        self._step["layer_steps"] = self._step.get("layer_steps", 0) + 1

    def end_token(self, context: int) -> None:
        """Close one decode step (token) of ``context`` keys: its stats summed over layers
        (``steps``) and per layer (``layer_steps``, what ``--activity`` records)."""
        if self._step:
            self.steps.append({"context": context, **self._step})
            self.layer_steps.append({"context": context, "layers": self._layers})
        self._step, self._layers = {}, {}

    def _mac_state(self, layer: int, hq: int, hkv: int, d: int, scale: float):
        """Layer ``layer``'s MAC state: the float reference (``mac``) or the decode engine's model
        (``mac-decode``), at the config that layer runs (``full_layers``)."""
        cls = MacDecodeLayer if self.method == "mac-decode" else MacLayerState
        return cls(layer_config(self.mac, layer), hq, hkv, d, scale)

    # -- the attention function (transformers' AttentionInterface signature) ------------------------
    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        B, Hq, Sq, D = query.shape
        scale = float(scaling or module.scaling)
        if self.method == "full" or Sq > 1:
            out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                         dropout=dropout, **kw)
            if self.method == "lad-tile" and Sq == key.shape[2]:  # a prefill from 0: the tile decodes it
                g = Hq // key.shape[1]
                st = self.states[module.layer_idx] = TileLayerState(self.tile, Hq, scale, g)
                k, v = key[0].repeat_interleave(g, 0), value[0].repeat_interleave(g, 0)
                for t in range(Sq):
                    st.step(query[0, :, t], k[:, t], v[:, t])
                if self.prefill_bar is not None:
                    self.prefill_bar.update(Sq)
            if self.method in ("mac", "mac-decode") and Sq == key.shape[2]:  # a prefill from 0: fill the ring
                layer = module.layer_idx
                st = self.states.setdefault(layer, self._mac_state(layer, Hq, key.shape[1], D, scale))
                q_pre = self.q_pre[module.layer_idx].view(Sq, Hq, D).transpose(0, 1)
                st.prefill(q_pre, query[0], key[0], value[0])
            return out
        if B != 1:
            raise ConfigError("LAD/MAC decoding supports batch size 1 only")
        layer, L, Hkv = module.layer_idx, key.shape[2], key.shape[1]
        g = Hq // Hkv
        st = self.states.get(layer)
        if self.method == "lad":
            if st is None:
                st = self.states[layer] = self.lad_head(replace(self.lad, head_dim=D, scale=scale), Hq)
            k = key[0].repeat_interleave(g, 0)
            v = value[0].repeat_interleave(g, 0)
            if st.length < L - 1:  # positions written by a prefill: LAD's "missing positions"
                st.prefill(k[:, st.length:L - 1], v[:, st.length:L - 1])
            out, stats = st.step(query[0, :, 0], k[:, -1], v[:, -1])
        elif self.method == "lad-tile":
            if st is None:
                st = self.states[layer] = TileLayerState(self.tile, Hq, scale, g)
            if st.length != L - 1:
                raise ConfigError("lad-tile decoding needs every earlier position decoded by the tile "
                                  "(context 0, or a prefill from position 0)")
            out, stats = st.step(query[0, :, 0], key[0, :, -1].repeat_interleave(g, 0),
                                 value[0, :, -1].repeat_interleave(g, 0))
        else:
            if st is None:
                st = self.states[layer] = self._mac_state(layer, Hq, Hkv, D, scale)
            q_pre = self.q_pre[layer].view(-1, Hq, D)[-1]
            out, stats = st.decode_step(q_pre, query[0, :, 0], key[0], value[0], L - 1)
        self.add(stats, layer)
        return out.to(query.dtype).reshape(1, 1, Hq, D), None
