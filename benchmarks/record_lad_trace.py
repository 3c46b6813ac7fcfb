"""Record real decode sequences for the LAD tile: post-RoPE q and the KV head's k, v of several
(layer, query head) pairs of SmolLM2-135M over the first tokens of WikiText-2 test.

    .venv/bin/python -m benchmarks.record_lad_trace [--tokens 512] [--heads 3:0 12:4 25:8]
        [--out testbenches/data/smollm2_lad_trace.pt]

One forward pass with a recording attention function (transformers' AttentionInterface);
position t's q, k, v are exactly what decode step t sees (causal attention). Stored as
float16 ``q, k, v (heads, tokens, 64)`` with ``pairs`` and the command. The benchmark
(benchmarks/lad_vs_dense.py) records longer sequences the same way at run time.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from golden.paths import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / "testbenches" / "data" / "smollm2_lad_trace.pt"
DEFAULT_PAIRS = ((3, 0), (12, 4), (25, 8))


def forward_with(model, ids, record, name: str = "ladmac_record") -> None:
    """One no-grad forward pass of ``model`` over ``ids`` in which every attention call first hands
    ``(module, query, key, value)`` to ``record`` (transformers' AttentionInterface); sdpa computes
    the output."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, **kw):
        record(module, query, key, value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    with torch.no_grad():
        model(ids)


def record_heads(tokens: int, pairs=DEFAULT_PAIRS) -> dict:
    """q, k, v (len(pairs), tokens, head_dim) float32 of each (layer, query head) pair."""
    from golden.llm.data import wikitext_ids
    from golden.llm.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    ids = wikitext_ids(tokenizer, tokens).reshape(1, -1)
    layers = {layer for layer, _ in pairs}
    captured = {}

    def keep(module, query, key, value):
        if module.layer_idx in layers:
            captured[module.layer_idx] = (query[0].detach(), key[0].detach(), value[0].detach())

    forward_with(model, ids, keep, "ladmac_record_lad")
    qs, ks, vs = [], [], []
    for layer, head in pairs:
        q, k, v = captured[layer]
        group = q.shape[0] // k.shape[0]
        qs.append(q[head])
        ks.append(k[head // group])
        vs.append(v[head // group])
    return {"q": torch.stack(qs).float(), "k": torch.stack(ks).float(), "v": torch.stack(vs).float(),
            "pairs": [list(p) for p in pairs], "tokens": ids.shape[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--heads", nargs="+", default=[f"{l}:{h}" for l, h in DEFAULT_PAIRS],
                        help="LAYER:QUERY_HEAD pairs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    pairs = tuple(tuple(int(x) for x in s.split(":")) for s in args.heads)
    trace = record_heads(args.tokens, pairs)
    trace = {**trace, "q": trace["q"].half(), "k": trace["k"].half(), "v": trace["v"].half(),
             "command": "python -m benchmarks.record_lad_trace " + f"--tokens {args.tokens} --heads {' '.join(args.heads)}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(trace, args.out)
    print(f"wrote {args.out}: q/k/v {tuple(trace['q'].shape)} for (layer, head) {trace['pairs']}; "
          f"|q| max {trace['q'].float().abs().max():.2f}, |k| max {trace['k'].float().abs().max():.2f}, "
          f"|v| max {trace['v'].float().abs().max():.2f}")


if __name__ == "__main__":
    main()
