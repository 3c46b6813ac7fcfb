"""The decoding runs behind ``ladmac eval lad|mac``, each on a :class:`golden.llm.hooks.Controller`
(the model it is attached to runs the chosen attention): teacher-forced token-by-token NLL
after a full-attention prefill, the full-attention baseline in one pass, and greedy generation
(alone, or paired with full attention from one shared prefill)."""
from __future__ import annotations

import copy

import torch

from ..errors import ConfigError
from .hooks import Controller
from .metrics import summarize

MODELS = ("smollm2",)


def _known(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (known: {', '.join(MODELS)})")


def max_positions(name: str = "smollm2") -> int:
    """The model's ``max_position_embeddings``, read from its package's metadata (no weights loaded)."""
    _known(name)
    from .smollm2 import max_position_embeddings
    return max_position_embeddings()


def load_model(name: str = "smollm2"):
    """``(model, tokenizer)``; attach a :class:`Controller` to the model to run LAD / MAC in it."""
    _known(name)
    from .smollm2 import load_smollm2
    return load_smollm2()


def _tqdm(iterable, desc: str, progress: bool):
    from tqdm import tqdm
    return tqdm(iterable, desc=desc, disable=not progress, leave=False)


@torch.no_grad()
def teacher_forced(ctl: Controller, ids: torch.Tensor, method: str, context: int = 0, lad=None, mac=None,
                   tile=None, keep_logits: bool = False, progress: bool = True, desc: str = ""):
    """Feed ``ids`` token by token after a full-attention prefill of ``ids[:context]``; returns
    ``(nll per scored token, logits or None, controller stats)``. Scored tokens: ``ids[context+1:]``."""
    from transformers import DynamicCache
    ctl.start(method, lad, mac, tile)
    model = ctl.model
    ids = ids.reshape(1, -1)
    cache = DynamicCache()
    if context > 0:
        if method == "lad-tile":   # the tile decodes the prefill position by position: the slow part
            ctl.prefill_bar = _tqdm(range(context * len(model.model.layers)), f"{desc or method} prefill", progress)
        model(ids[:, :context], past_key_values=cache, use_cache=True)
        if ctl.prefill_bar is not None:
            ctl.prefill_bar.close()
            ctl.prefill_bar = None
    nll, logits_all = [], []
    for t in _tqdm(range(context, ids.shape[1] - 1), desc or f"{method} ppl", progress):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        logits = out.logits[0, -1].float()
        ctl.end_token(t + 1)
        nll.append(float(torch.nn.functional.cross_entropy(logits[None], ids[0, t + 1:t + 2])))
        if keep_logits:
            logits_all.append(logits)
    return nll, (torch.stack(logits_all) if keep_logits else None), summarize(ctl)


@torch.no_grad()
def full_parallel(ctl: Controller, ids: torch.Tensor, context: int = 0, keep_logits: bool = False):
    """Full-attention baseline in one forward pass: NLL of ``ids[context+1:]`` (same tokens as
    :func:`teacher_forced`), and their logits if asked."""
    ctl.start("full")
    logits = ctl.model(ids.reshape(1, -1)).logits[0, context:-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[context + 1:], reduction="none")
    return nll.tolist(), (logits if keep_logits else None)


@torch.no_grad()
def greedy_pair(ctl: Controller, prompt: torch.Tensor, new_tokens: int, method: str, lad=None, mac=None,
                tile=None, progress: bool = True, desc: str = ""):
    """Greedy continuations of ``prompt`` with full attention and with ``method``, sharing one
    full-attention prefill (the cache is copied). Returns ``(reference ids, method ids, stats)``."""
    from transformers import DynamicCache
    ctl.start(method, lad, mac, tile)
    model = ctl.model
    cache = DynamicCache()
    first = model(prompt.reshape(1, -1), past_key_values=cache, use_cache=True).logits[0, -1]
    runs = {}
    for name in ("full", method):
        c = copy.deepcopy(cache) if name == "full" else cache
        ctl.method = name
        tok = int(first.argmax())
        gen = [tok]
        for i in _tqdm(range(new_tokens - 1), f"{desc} {name}", progress):
            out = model(torch.tensor([[tok]]), past_key_values=c, use_cache=True)
            if name == method:
                ctl.end_token(prompt.numel() + i + 1)
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
        runs[name] = gen
    return runs["full"], runs[method], summarize(ctl)


@torch.no_grad()
def greedy(ctl: Controller, prompt: torch.Tensor, new_tokens: int, method: str, lad=None, mac=None, tile=None,
           progress: bool = True, desc: str = ""):
    """Greedy continuation (token ids) of ``prompt`` (prefilled with full attention)."""
    from transformers import DynamicCache
    ctl.start(method, lad, mac, tile)
    model = ctl.model
    cache = DynamicCache()
    out = model(prompt.reshape(1, -1), past_key_values=cache, use_cache=True)
    tok = int(out.logits[0, -1].argmax())
    gen = [tok]
    for i in _tqdm(range(new_tokens - 1), desc or f"{method} gen", progress):
        out = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
        ctl.end_token(prompt.numel() + i + 1)
        tok = int(out.logits[0, -1].argmax())
        gen.append(tok)
    return gen, summarize(ctl)
