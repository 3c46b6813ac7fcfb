"""The range of attention scores a model produces: what ``score_width``/``score_frac`` must hold.

    .venv/bin/python -m benchmarks.score_range [--tokens 2048]

One forward pass of SmolLM2-135M over the first WikiText-2 test tokens with a recording attention
function (transformers' AttentionInterface). Per layer: the largest ``|s|`` (``s = q.k / sqrt(d)``,
causal positions only), the largest ``m - s`` (``m``: the step's maximum score; what ``x = s - m``
must reach before the PWL cutoff stops mattering for MD's corrections) and its 99.9th percentile.
docs/lad-tile.md ("Numerics") quotes the result.
"""
from __future__ import annotations

import argparse
import math

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    from benchmarks.record_lad_trace import forward_with
    from golden.llm.data import wikitext_ids
    from golden.llm.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    ids = wikitext_ids(tokenizer, args.tokens).reshape(1, -1)
    rows = {}

    def measure(module, query, key, value):
        q, k = query[0].float(), key[0].float()
        k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
        s = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        m = s.masked_fill(~causal, -math.inf).amax(-1, keepdim=True)
        gap = (m - s)[:, causal]
        rows[module.layer_idx] = (float(s[:, causal].abs().max()), float(gap.max()),
                                  float(torch.quantile(gap[:, ::max(1, gap.shape[1] // 200000)].flatten(), 0.999)))

    forward_with(model, ids, measure, "ladmac_score_range")
    print("| layer | max abs(s) | max m - s | 99.9th pct m - s |\n|---|---|---|---|")
    for layer, (smax, gmax, gq) in sorted(rows.items()):
        print(f"| {layer} | {smax:.1f} | {gmax:.1f} | {gq:.1f} |")
    print(f"all layers: max |s| {max(r[0] for r in rows.values()):.1f}, max m - s {max(r[1] for r in rows.values()):.1f} "
          f"({args.tokens} tokens)")


if __name__ == "__main__":
    main()
