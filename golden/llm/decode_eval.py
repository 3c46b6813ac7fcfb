"""LAD and MAC inside SmolLM2-135M during decoding (docs/algorithms.md §1, §2), through transformers'
attention interface (no copied modeling code; pre-RoPE queries from a hook on ``q_proj``).

Evaluations: teacher-forced token-by-token perplexity on WikiText-2 vs full attention on the
same tokens, greedy-generation agreement with full attention (ROUGE-L F1 on token ids, exact
token agreement), and per-run stats of each method. ``ladmac eval lad|mac`` runs them.

``lad-tile`` runs the LAD tile's bit-accurate model (golden/lad_tile.py, bit-exact with the RTL)
for every query head of every layer: the hardware's numerics on the real model
(``ladmac eval lad --hardware``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..errors import ConfigError, DataError
from ..lad_ref import LadConfig, LadHead
from ..lad_tile import LadTileConfig, LadTileModel
from ..mac_ref import MacConfig, MacLayerState
from ..paths import DATA_ROOT

ATTN_NAME = "ladmac_decode"
MODELS = ("smollm2",)


# -- ROUGE-L ------------------------------------------------------------------------------------
def lcs_length(a, b) -> int:
    """Length of the longest common subsequence of two sequences (O(len(a) len(b)) DP)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate, reference) -> float:
    """ROUGE-L F1 (beta = 1) between two token sequences: 2 P R / (P + R) with P = LCS/|cand|, R = LCS/|ref|."""
    lcs = lcs_length(list(candidate), list(reference))
    if lcs == 0:
        return 0.0
    p, r = lcs / len(candidate), lcs / len(reference)
    return 2 * p * r / (p + r)


# -- the attention hook ----------------------------------------------------------------------
@dataclass
class Controller:
    """Which attention runs, its per-layer states, the captured pre-RoPE queries and stats."""

    method: str = "full"  # full | lad | lad-tile | mac
    lad: LadConfig = field(default_factory=LadConfig)
    tile: LadTileConfig = field(default_factory=LadTileConfig)
    mac: MacConfig = field(default_factory=MacConfig)
    states: dict = field(default_factory=dict)
    q_pre: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)   # per decode step (token): aggregated over layers
    _step: dict = field(default_factory=dict)

    def reset(self):
        self.states, self.q_pre, self._step = {}, {}, {}

    def add(self, stats: dict):
        for k, v in stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.totals[k] = self.totals.get(k, 0) + v
                self._step[k] = self._step.get(k, 0) + v
        self.totals["layer_steps"] = self.totals.get("layer_steps", 0) + 1

    def end_token(self, context: int):
        if self._step:
            self.steps.append({"context": context, **self._step})
        self._step = {}


_CTL = Controller()


class TileLayerState:
    """One layer's query heads on the LAD tile's bit-accurate model, one ``LadTileModel`` per
    query head (a tile serves one head; GQA heads read their group's k, v): float q, k, v are
    quantized to the tile's kv format (saturating; saturated elements are counted), ``o`` comes
    back as float. A step is exactly what the RTL computes for that head."""

    def __init__(self, cfg: LadTileConfig, heads: int, scale: float):
        if abs(scale * math.sqrt(cfg.head_dim) - 1) > 1e-6:
            raise ConfigError(f"the LAD tile scales scores by 1/sqrt(head_dim); the model uses {scale}")
        self.cfg = cfg
        self.tiles = [LadTileModel(cfg) for _ in range(heads)]
        self.saturated = 0

    @property
    def length(self) -> int:
        return self.tiles[0].n

    @property
    def n_centers(self) -> torch.Tensor:
        return torch.tensor([t.n_centers for t in self.tiles])

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """``q, k, v (heads, d)`` float -> ``o (heads, d)`` float and the step's stats summed over
        heads, with the float reference's keys (``keys_read`` counts candidates plus the new key)."""
        f = self.cfg.kv_format
        raw = [f.quantize(t) for t in (q, k, v)]
        hi, lo = (1 << (f.width - 1)) - 1, -(1 << (f.width - 1))
        sat = sum(int(((r == hi) | (r == lo)).sum()) for r in raw)
        self.saturated += sat
        H = len(self.tiles)
        outs = []
        tot = {"heads": H, "positions": 0, "candidates": 0, "active": 0, "false_alarms": 0, "mode_changes": 0,
               "centers": 0, "keys_read": 0, "values_read": 0, "kv_beats": 0, "saturated": sat}
        for h, tile in enumerate(self.tiles):
            o, st = tile.step(raw[0][h], raw[1][h], raw[2][h])
            if st["overflow"]:
                raise ConfigError(f"context exceeds the tile's max_positions ({self.cfg.max_positions})")
            outs.append(o)
            for key in ("candidates", "active", "false_alarms", "mode_changes", "centers", "kv_beats"):
                tot[key] += st[key]
            tot["keys_read"] += st["candidates"] + 1
            tot["values_read"] += st["active"] + 1
        tot["positions"] = self.length
        return f.to_float(torch.stack(outs)), tot


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    ctl = _CTL
    B, Hq, Sq, D = query.shape
    if ctl.method == "full" or Sq > 1:
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                     dropout=dropout, **kw)
        if ctl.method == "lad-tile" and Sq == key.shape[2]:  # a prefill from 0: the tile decodes it
            g = Hq // key.shape[1]
            st = ctl.states[module.layer_idx] = TileLayerState(ctl.tile, Hq, float(scaling or module.scaling))
            k, v = key[0].repeat_interleave(g, 0), value[0].repeat_interleave(g, 0)
            for t in range(Sq):
                st.step(query[0, :, t], k[:, t], v[:, t])
        if ctl.method == "mac" and Sq == key.shape[2]:  # a prefill from position 0: fill the ring
            st = ctl.states.setdefault(module.layer_idx, MacLayerState(
                ctl.mac, Hq, key.shape[1], D, scaling or module.scaling))
            q_pre = ctl.q_pre[module.layer_idx].view(Sq, Hq, D).transpose(0, 1)
            st.prefill(q_pre, query[0], key[0], value[0])
        return out
    if B != 1:
        raise ConfigError("LAD/MAC decoding supports batch size 1 only")
    layer, L, Hkv = module.layer_idx, key.shape[2], key.shape[1]
    g = Hq // Hkv
    if ctl.method == "lad":
        st = ctl.states.get(layer)
        if st is None:
            st = ctl.states[layer] = LadHead(replace(ctl.lad, head_dim=D, scale=float(scaling or module.scaling)), Hq)
        k = key[0].repeat_interleave(g, 0)
        v = value[0].repeat_interleave(g, 0)
        if st.length < L - 1:  # positions written by a prefill: LAD's "missing positions"
            st.prefill(k[:, st.length:L - 1], v[:, st.length:L - 1])
        out, stats = st.step(query[0, :, 0], k[:, -1], v[:, -1])
    elif ctl.method == "lad-tile":
        st = ctl.states.get(layer)
        if st is None:
            st = ctl.states[layer] = TileLayerState(ctl.tile, Hq, float(scaling or module.scaling))
        if st.length != L - 1:
            raise ConfigError("lad-tile decoding needs every earlier position decoded by the tile "
                              "(context 0, or a prefill from position 0)")
        out, stats = st.step(query[0, :, 0], key[0, :, -1].repeat_interleave(g, 0),
                             value[0, :, -1].repeat_interleave(g, 0))
    else:
        st = ctl.states.get(layer)
        if st is None:
            st = ctl.states[layer] = MacLayerState(ctl.mac, Hq, Hkv, D, float(scaling or module.scaling))
        q_pre = ctl.q_pre[layer].view(-1, Hq, D)[-1]
        out, stats = st.decode_step(q_pre, query[0, :, 0], key[0], value[0], L - 1)
    ctl.add(stats)
    return out.to(query.dtype).reshape(1, 1, Hq, D), None


def install(model) -> None:
    """Register the dispatching attention and the q_proj hooks (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(ATTN_NAME, _attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    model.set_attn_implementation(ATTN_NAME)
    if getattr(model, "_ladmac_hooks", None):
        return
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, i=i):
            _CTL.q_pre[i] = out[0].detach()
        hooks.append(layer.self_attn.q_proj.register_forward_hook(hook))
    model._ladmac_hooks = hooks


# -- data ----------------------------------------------------------------------------------------
def load_model(name: str = "smollm2"):
    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    from .smollm2 import load_smollm2
    model, tokenizer = load_smollm2()
    install(model)
    return model, tokenizer


def wikitext_path(path: Path | None = None) -> Path:
    return Path(path) if path is not None else DATA_ROOT / "wikitext2" / "test.txt"


def read_wikitext(path: Path | None = None) -> str:
    """The text of WikiText-2 test (``path`` or the shared copy); :class:`DataError` when the file is
    missing, unreadable, not UTF-8, binary or too short. Needs no model: the CLI checks it first."""
    path = wikitext_path(path)
    if not path.exists():
        raise DataError(f"WikiText-2 file not found: {path}")
    if not path.is_file():
        raise DataError(f"WikiText-2 file {path} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"WikiText-2 file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"cannot read WikiText-2 file {path}: {err.strerror or err}") from None
    if "\x00" in text[:100000] or len(text.split()) < 100:
        raise DataError(f"WikiText-2 file {path} is malformed (empty, binary or under 100 words)")
    return text


def wikitext_ids(tokenizer, need: int, path: Path | None = None, text: str | None = None) -> torch.Tensor:
    """The first ``need`` token ids of WikiText-2 test (1-D); ``text`` skips re-reading the file."""
    path = wikitext_path(path)
    if text is None:
        text = read_wikitext(path)
    chars = max(20000, need * 8)
    ids = tokenizer(text[:chars], return_tensors="pt").input_ids[0]
    if ids.numel() < need:
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if ids.numel() < need:
        raise DataError(f"WikiText-2 file {path} has {ids.numel()} tokens, {need} needed")
    return ids[:need]


# -- evaluations ---------------------------------------------------------------------------------
def _configure(method: str, lad: LadConfig | None = None, mac: MacConfig | None = None,
               tile: LadTileConfig | None = None) -> Controller:
    _CTL.method = method
    _CTL.lad = lad or LadConfig()
    _CTL.mac = mac or MacConfig()
    _CTL.tile = tile or LadTileConfig()
    _CTL.totals, _CTL.steps = {}, []
    _CTL.reset()
    return _CTL


@torch.no_grad()
def teacher_forced(model, ids: torch.Tensor, method: str, context: int = 0, lad=None, mac=None, tile=None,
                   keep_logits: bool = False, progress: bool = True, desc: str = ""):
    """Feed ``ids`` token by token after a full-attention prefill of ``ids[:context]``; returns
    ``(nll per scored token, logits or None, controller stats)``. Scored tokens: ``ids[context+1:]``."""
    from transformers import DynamicCache
    from tqdm import tqdm
    ctl = _configure(method, lad, mac, tile)
    ids = ids.reshape(1, -1)
    cache = DynamicCache()
    if context > 0:
        model(ids[:, :context], past_key_values=cache, use_cache=True)
    nll, logits_all = [], []
    for t in tqdm(range(context, ids.shape[1] - 1), desc=desc or f"{method} ppl", disable=not progress,
                  leave=False):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        logits = out.logits[0, -1].float()
        ctl.end_token(t + 1)
        nll.append(float(torch.nn.functional.cross_entropy(logits[None], ids[0, t + 1:t + 2])))
        if keep_logits:
            logits_all.append(logits)
    return nll, (torch.stack(logits_all) if keep_logits else None), summarize(ctl)


@torch.no_grad()
def full_parallel(model, ids: torch.Tensor, context: int = 0, keep_logits: bool = False):
    """Full-attention baseline in one forward pass: NLL of ``ids[context+1:]`` (same tokens as
    :func:`teacher_forced`), and their logits if asked."""
    _configure("full")
    logits = model(ids.reshape(1, -1)).logits[0, context:-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[context + 1:], reduction="none")
    return nll.tolist(), (logits if keep_logits else None)


@torch.no_grad()
def greedy_pair(model, prompt: torch.Tensor, new_tokens: int, method: str, lad=None, mac=None, tile=None,
                progress: bool = True, desc: str = ""):
    """Greedy continuations of ``prompt`` with full attention and with ``method``, sharing one
    full-attention prefill (the cache is copied). Returns ``(reference ids, method ids, stats)``."""
    import copy
    from transformers import DynamicCache
    from tqdm import tqdm
    ctl = _configure(method, lad, mac, tile)
    cache = DynamicCache()
    first = model(prompt.reshape(1, -1), past_key_values=cache, use_cache=True).logits[0, -1]
    runs = {}
    for name in ("full", method):
        c = copy.deepcopy(cache) if name == "full" else cache
        ctl.method = name
        tok = int(first.argmax())
        gen = [tok]
        for i in tqdm(range(new_tokens - 1), desc=f"{desc} {name}", disable=not progress, leave=False):
            out = model(torch.tensor([[tok]]), past_key_values=c, use_cache=True)
            if name == method:
                ctl.end_token(prompt.numel() + i + 1)
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
        runs[name] = gen
    return runs["full"], runs[method], summarize(ctl)


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int, method: str, lad=None, mac=None, tile=None,
           progress: bool = True, desc: str = ""):
    """Greedy continuation (token ids) of ``prompt`` (prefilled with full attention)."""
    from transformers import DynamicCache
    from tqdm import tqdm
    ctl = _configure(method, lad, mac, tile)
    cache = DynamicCache()
    out = model(prompt.reshape(1, -1), past_key_values=cache, use_cache=True)
    tok = int(out.logits[0, -1].argmax())
    gen = [tok]
    for i in tqdm(range(new_tokens - 1), desc=desc or f"{method} gen", disable=not progress, leave=False):
        out = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
        ctl.end_token(prompt.numel() + i + 1)
        tok = int(out.logits[0, -1].argmax())
        gen.append(tok)
    return gen, summarize(ctl)


def summarize(ctl: Controller) -> dict:
    """Run-level stats of the controller's method."""
    t = ctl.totals
    if ctl.method in ("lad", "lad-tile") and t.get("positions"):
        hp = t["positions"]  # sum over layer-steps of positions (x heads below)
        heads = t["heads"] / max(1, t["layer_steps"])
        pos_heads = hp * heads
        centers = [int(s.n_centers.float().mean()) for s in ctl.states.values()]
        lengths = [s.length for s in ctl.states.values()]
        return {
            "active_pct": 100.0 * t["active"] / pos_heads,
            "candidates_pct": 100.0 * t["candidates"] / pos_heads,
            "false_alarm_pct": 100.0 * t["false_alarms"] / pos_heads,
            **({"missed_pct": 100.0 * t["missed"] / pos_heads} if "missed" in t else {}),
            **({"saturated_elements": t["saturated"]} if "saturated" in t else {}),
            "mode_changes_pct": 100.0 * t["mode_changes"] / pos_heads,
            "keys_read_pct": 100.0 * t["keys_read"] / pos_heads,
            "values_read_pct": 100.0 * t["values_read"] / pos_heads,
            "centers_per_head_mean": sum(c for c in centers) / max(1, len(centers)),
            "positions_at_end": max(lengths) if lengths else 0,
            "centers_per_head_min": min(int(s.n_centers.min()) for s in ctl.states.values()),
            "centers_per_head_max": max(int(s.n_centers.max()) for s in ctl.states.values()),
            "layer_steps": t["layer_steps"],
        }
    if ctl.method == "mac" and t.get("heads"):
        engaged = [s for s in ctl.steps if s.get("misses", 0) + s.get("hits", 0) > 0]
        eh = sum(s["heads"] for s in engaged)
        return {
            "hit_rate": t["hits"] / eh if eh else 0.0,
            "skip_ratio": 1.0 - t["kv_read"] / t["kv_total"],
            "skip_ratio_engaged": (1.0 - sum(s["kv_read"] for s in engaged) / sum(s["kv_total"] for s in engaged))
            if engaged else 0.0,
            "fallbacks": t["fallbacks"], "engaged_steps": len(engaged), "steps": len(ctl.steps),
            "layer_steps": t["layer_steps"],
        }
    return {"layer_steps": t.get("layer_steps", 0)}


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))


# -- CLI -----------------------------------------------------------------------------------------
DEFAULTS = {"lad": dict(tokens=128, context=0, prompts=2, new_tokens=32, prompt_len=64),
            "mac": dict(tokens=64, context=2048, prompts=1, new_tokens=32, prompt_len=2048)}


def _parser(method: str) -> argparse.ArgumentParser:
    d = DEFAULTS[method]
    p = argparse.ArgumentParser(prog=f"ladmac eval {method}", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="model (only smollm2)")
    p.add_argument("--tokens", type=int, default=d["tokens"], help="teacher-forced tokens scored")
    p.add_argument("--context", type=int, default=d["context"],
                   help="tokens prefilled with full attention before the scored ones")
    p.add_argument("--prompts", type=int, default=d["prompts"], help="greedy-generation prompts")
    p.add_argument("--new-tokens", type=int, default=d["new_tokens"], help="tokens generated per prompt")
    p.add_argument("--prompt-len", type=int, default=d["prompt_len"], help="prompt length in tokens")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help=f"override a {'LadConfig' if method == 'lad' else 'MacConfig'} parameter")
    if method == "lad":
        p.add_argument("--hardware", action="store_true",
                       help="also run the LAD tile's bit-accurate model (golden/lad_tile.py, bit-exact with the "
                            "RTL) for every head, and its float twin (lad-tile-float)")
        p.add_argument("--tile-set", action="append", default=[], metavar="NAME=VALUE",
                       help="override a LadTileConfig parameter of --hardware")
    p.add_argument("--ablate", action="store_true",
                   help="also run the ablation variant (LAD: exact scores = PWL error only; "
                        "MAC: exact prefix = merge machinery only)")
    p.add_argument("--data", type=Path, default=None, help="WikiText-2 test.txt (default: shared data)")
    p.add_argument("--out", type=Path, default=None, help="write results JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest for the many small ops of LAD/MAC; 0 = torch default)")
    p.add_argument("--no-progress", action="store_true")
    return p


MODEL_FIELDS = ("head_dim", "scale")  # LadConfig fields the model fixes (set per layer from the model)


def check_config(method: str, overrides: dict[str, str]):
    """``LadConfig`` / ``MacConfig`` from ``--set`` strings, rejecting what would only fail (or be
    silently ignored) once the model runs: non-finite numbers, model-fixed fields, a PWL table
    that cannot be built."""
    cfg_cls = LadConfig if method == "lad" else MacConfig
    cfg = cfg_cls.from_overrides(overrides)
    for name in overrides:
        value = getattr(cfg, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{cfg_cls.__name__}: {name} must be finite, got {value}")
        if method == "lad" and name in MODEL_FIELDS:
            raise ConfigError(f"LadConfig: {name} is set from the model (head_dim 64, scale 1/8); "
                              f"it cannot be overridden here")
    if method == "lad":
        try:
            pwl = cfg.pwl
            ok = all(math.isfinite(x) for x in (*pwl.slopes, *pwl.intercepts, pwl.max_relative_error))
            why = "non-finite coefficients"
        except (ArithmeticError, ValueError) as err:
            ok, why = False, str(err)
        if not ok:
            raise ConfigError(f"LadConfig: no usable PWL table for pwl_intervals={cfg.pwl_intervals}, "
                              f"pwl_cutoff={cfg.pwl_cutoff} ({why})")
    return cfg


def _check_output(out: Path | None, plot_dir: Path | None) -> None:
    """Fail before the run, not after it, when the JSON or the plots cannot be written."""
    if out is not None:
        if out.is_dir():
            raise ConfigError(f"--out {out} is a directory (give a file name)")
        parent = out.parent if str(out.parent) else Path(".")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"--out {out}: cannot create {parent} ({err.strerror or err})") from None
        if not os.access(parent, os.W_OK):
            raise ConfigError(f"--out {out}: folder {parent} is not writable")
    if plot_dir is not None:
        if plot_dir.exists() and not plot_dir.is_dir():
            raise ConfigError(f"--plot {plot_dir} is not a folder")
        try:
            plot_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"--plot {plot_dir}: cannot create it ({err.strerror or err})") from None
        if not os.access(plot_dir, os.W_OK):
            raise ConfigError(f"--plot {plot_dir} is not writable")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in items:
        if "=" not in pair:
            raise ConfigError(f"{flag} expects NAME=VALUE, got '{pair}'")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def main(method: str, argv: list[str]) -> int:
    """``ladmac eval lad|mac [options]``: prints a table, writes JSON / PNGs; returns the exit code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if method not in DEFAULTS:
        raise ConfigError(f"unknown method '{method}' (known: lad, mac)")
    parser = _parser(method)

    def error(message):
        raise ConfigError(f"eval {method}: {message}")
    parser.error = error
    args = parser.parse_args(argv)
    for name in ("tokens", "prompts", "new_tokens", "prompt_len"):
        if getattr(args, name) < (0 if name == "prompts" else 1):
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.context < 0:
        raise ConfigError(f"--context must be >= 0, got {args.context}")
    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0 (0 = torch default), got {args.threads}")
    overrides = _pairs(args.set, "--set")
    cfg = check_config(method, overrides)
    tile_cfg = None
    if getattr(args, "hardware", False) or getattr(args, "tile_set", []):
        if not args.hardware:
            raise ConfigError("--tile-set needs --hardware")
        tile_cfg = LadTileConfig.from_overrides(_pairs(args.tile_set, "--tile-set"))
        if tile_cfg.head_dim != 64:
            raise ConfigError(f"LadTileConfig: head_dim is 64 for SmolLM2, got {tile_cfg.head_dim}")
        longest = max(args.context + args.tokens, args.prompt_len + args.new_tokens if args.prompts else 0)
        if longest > tile_cfg.max_positions:
            raise ConfigError(f"--hardware: a context of {longest} tokens exceeds the tile's max_positions "
                              f"({tile_cfg.max_positions})")
    if args.model not in MODELS:
        raise ConfigError(f"unknown model '{args.model}' (known: {', '.join(MODELS)})")
    # everything that needs no model is checked before the (slow) model load
    text = read_wikitext(args.data)
    _check_output(args.out, args.plot)
    progress = not args.no_progress
    t_start = time.time()
    model, tokenizer = load_model(args.model)
    stride = max(64, args.prompt_len // 8)  # prompt i starts at token i * stride
    need = max(args.context + args.tokens + 1, (args.prompts - 1) * stride + args.prompt_len)
    if args.threads:
        torch.set_num_threads(args.threads)
    ids = wikitext_ids(tokenizer, need, args.data, text=text)

    kw = (lambda c: {"lad": c}) if method == "lad" else (lambda c: {"mac": c})
    variants = {method: (method, kw(cfg))}   # name -> (attention method, its config)
    if args.ablate:
        variants[f"{method}-{'exact-scores' if method == 'lad' else 'exact-prefix'}"] = (method, kw(replace(
            cfg, **({"exact_scores": True} if method == "lad" else {"exact_prefix": True}))))
    if tile_cfg is not None:
        variants["lad-tile-float"] = ("lad", {"lad": tile_cfg.reference()})
        variants["lad-tile"] = ("lad-tile", {"tile": tile_cfg})

    results = {"method": method, "model": args.model, "command": "ladmac eval " + " ".join([method, *argv]),
               "config": cfg.to_dict(), **({"tile_config": tile_cfg.to_dict()} if tile_cfg else {}), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                for k, v in vars(args).items()}}
    seq = ids[:args.context + args.tokens + 1]
    nll_full, _ = full_parallel(model, seq, args.context)
    ppl = {"full": perplexity(nll_full)}
    stats = {}
    steps = {}
    for name, (m_name, m_kw) in variants.items():
        nll, _, st = teacher_forced(model, seq, m_name, args.context, progress=progress, desc=f"{name} ppl", **m_kw)
        ppl[name] = perplexity(nll)
        stats[name] = st
        steps[name] = list(_CTL.steps)
    results["perplexity"] = ppl
    results["perplexity_delta_pct"] = {k: 100.0 * (v / ppl["full"] - 1) for k, v in ppl.items()}
    results["teacher_forced_stats"] = stats

    generated = {"generation": (method, kw(cfg))}
    if tile_cfg is not None:
        generated["generation_hardware"] = ("lad-tile", {"tile": tile_cfg})
    for key, (m_name, m_kw) in generated.items():
        gen, gen_stats = [], []
        for i in range(args.prompts):
            prompt = ids[i * stride:i * stride + args.prompt_len]
            ref, out, st = greedy_pair(model, prompt, args.new_tokens, m_name, progress=progress,
                                       desc=f"{m_name} gen {i + 1}/{args.prompts}", **m_kw)
            agree = sum(a == b for a, b in zip(out, ref)) / len(ref)
            first = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref))
            gen.append({"rouge_l": rouge_l(out, ref), "token_agreement": agree, "first_divergence": first,
                        "reference": tokenizer.decode(ref), "output": tokenizer.decode(out)})
            gen_stats.append(st)
        if gen:
            results[key] = {
                "method": m_name, "prompts": args.prompts, "new_tokens": args.new_tokens,
                "prompt_len": args.prompt_len, "prompt_stride": stride,
                "rouge_l_mean": sum(g["rouge_l"] for g in gen) / len(gen),
                "token_agreement_mean": sum(g["token_agreement"] for g in gen) / len(gen),
                "identical": sum(g["first_divergence"] == args.new_tokens for g in gen),
                "per_prompt": gen, "stats": gen_stats}
    results["seconds"] = time.time() - t_start
    if method == "mac":
        results["steps"] = steps[method]
    _print_table(method, results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    if args.plot:
        for path in plot(method, results, args.plot):
            print(f"wrote {path}")
    return 0


def _print_table(method: str, r: dict) -> None:
    print(f"\n{method.upper()} on SmolLM2-135M, WikiText-2 teacher-forced ({r['args']['tokens']} tokens after "
          f"{r['args']['context']} context)")
    print(f"  {'variant':<22}{'perplexity':>12}{'vs full':>10}")
    for k, v in r["perplexity"].items():
        print(f"  {k:<22}{v:>12.4f}{r['perplexity_delta_pct'][k]:>+9.3f}%")
    for name, st in r["teacher_forced_stats"].items():
        print(f"  stats {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in st.items()))
    for key in ("generation", "generation_hardware"):
        g = r.get(key)
        if g:
            print(f"  greedy generation ({g['method']}), {g['prompts']} prompts x {g['new_tokens']} tokens: ROUGE-L "
                  f"{100 * g['rouge_l_mean']:.2f}%, token agreement {100 * g['token_agreement_mean']:.2f}%, "
                  f"identical {g['identical']}/{g['prompts']}")
    print(f"  ({r['seconds']:.0f} s)")


def plot(method: str, r: dict, folder: Path) -> list[Path]:
    """PNG plots: perplexity per variant; for MAC also hit rate / skip ratio vs context."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(r["perplexity"])
    vals = [r["perplexity"][n] for n in names]
    ax.bar(names, vals, color=["#777"] + ["#3a7"] * (len(names) - 1))
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    lo = min(vals)
    ax.set_ylim(lo * 0.97, max(vals) * 1.02)
    ax.set_ylabel("perplexity")
    ax.set_title(f"{method.upper()} vs full attention, SmolLM2-135M, WikiText-2\n"
                 f"{r['args']['tokens']} tokens after {r['args']['context']} context", fontsize=9)
    fig.tight_layout()
    p = folder / f"decode_{method}_perplexity.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    if method == "mac" and r.get("steps"):
        st = r["steps"]
        ctx = [s["context"] for s in st]
        hit = [s.get("hits", 0) / s["heads"] if s.get("hits", 0) + s.get("misses", 0) else 0 for s in st]
        skip = [1 - s["kv_read"] / s["kv_total"] for s in st]
        def smooth(y, w=32):  # trailing moving average over w steps
            out, acc = [], 0.0
            for i, x in enumerate(y):
                acc += x - (y[i - w] if i >= w else 0.0)
                out.append(acc / min(i + 1, w))
            return out
        fig, ax = plt.subplots(figsize=(6, 3.4))
        for y, color, label in ((hit, "C0", "hit rate (query heads x layers)"),
                                (skip, "C1", "skip ratio (KV positions not read)")):
            ax.plot(ctx, y, color=color, lw=0.6, alpha=0.35)
            ax.plot(ctx, smooth(y), color=color, lw=1.6, label=f"{label}, 32-step mean")
        band = r["config"]["band"]
        ax.plot(ctx, [max(0.0, 1 - band / c) for c in ctx], color="C1", ls=":", lw=1,
                label=f"skip ceiling 1 - S/context (S = {band})")
        ax.axvline(r["config"]["min_context"], color="#999", ls="--", lw=0.8, label="min_context")
        ax.set_xlabel("context (keys seen by the step)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("MAC on SmolLM2-135M, teacher-forced WikiText-2 (thin: per step)", fontsize=9)
        fig.tight_layout()
        p = folder / "decode_mac_hit_skip.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


if __name__ == "__main__":  # python -m golden.llm.decode_eval lad|mac ...
    from ..errors import LadmacError
    try:
        if len(sys.argv) < 2:
            raise ConfigError("usage: python -m golden.llm.decode_eval lad|mac [options]")
        sys.exit(main(sys.argv[1], sys.argv[2:]))
    except (LadmacError, OSError) as err:
        print(f"ladmac: error: {err}", file=sys.stderr)
        sys.exit(2)
