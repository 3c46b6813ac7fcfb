"""Record the MAC unit's real test data from SmolLM2-135M decoding over WikiText-2.

    .venv/bin/python -m benchmarks.record_mac_trace [--tokens 640] [--layer 12]
        [--out testbenches/data/smollm2_mac_trace.pt]

Runs SmolLM2 once over the first ``tokens`` tokens of WikiText-2 test (data/wikitext2/test.txt)
with a recording attention function (transformers' AttentionInterface) and a forward
hook on ``q_proj`` of one layer, and stores:

and, in a second file, one head's post-RoPE ``q`` and its KV head's ``k``, ``v``
(tokens, 64) each, for the dense-attention baseline and the LAD tile;

- ``q_pre``: pre-RoPE queries of the first KV group's query heads, (tokens, 3, 64);
- ``merge_cases``: raw (MacUnitConfig default formats) merge/removal transactions built
  from that layer's real partial softmax states (prefix, band and tail key ranges of
  docs/algorithms.md §2 at S = 256 for decode positions), with the float result of each:
  ``expect_o`` and ``expect_lse`` (the exact softmax over the merged or remaining keys).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from golden.mac_unit import MacUnitConfig, MergeOp, state_to_raw
from golden.paths import PROJECT_ROOT

DEFAULT_OUT = PROJECT_ROOT / "testbenches" / "data" / "smollm2_mac_trace.pt"
DEFAULT_HEAD_OUT = PROJECT_ROOT / "testbenches" / "data" / "smollm2_head_trace.pt"


def range_state(scores: torch.Tensor, values: torch.Tensor, lo: int, hi: int):
    """Float attention state (m, s, o, lse) over keys [lo, hi)."""
    sc = scores[lo:hi].double()
    m = float(sc.max())
    w = torch.exp(sc - m)
    s = float(w.sum())
    o = (w[:, None] * values[lo:hi].double()).sum(0) / s
    return m, s, o, m + math.log(s)


def record(tokens: int, layer: int, band: int | None = None, cases_per_kind: int = 60, seed: int = 0) -> dict:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from golden.llm.data import wikitext_ids
    from golden.llm.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    ids = wikitext_ids(tokenizer, tokens).reshape(1, -1)
    captured = {}

    def recording_attention(module, query, key, value, attention_mask, **kw):
        if module.layer_idx == layer:
            captured.update(q=query[0].detach(), k=key[0].detach(), v=value[0].detach(),
                            scaling=kw.get("scaling") or module.scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("ladmac_record", recording_attention)
    AttentionMaskInterface.register("ladmac_record", sdpa_mask)
    model.set_attn_implementation("ladmac_record")
    hook = model.model.layers[layer].self_attn.q_proj.register_forward_hook(
        lambda mod, inp, out: captured.__setitem__("q_pre", out[0].detach()))
    with torch.no_grad():
        model(ids)
    hook.remove()
    d = model.config.head_dim if hasattr(model.config, "head_dim") else 64
    q_pre = captured["q_pre"].reshape(ids.shape[1], -1, d)[:, :3]

    cfg = MacUnitConfig()
    band = cfg.reference().band if band is None else band   # S of the float reference the cases mirror
    gen = torch.Generator().manual_seed(seed)
    q, k, v, scaling = captured["q"], captured["k"], captured["v"], captured["scaling"]
    groups = q.shape[0] // k.shape[0]
    cases, expect_o, expect_lse = [], [], []
    n_tokens = ids.shape[1]
    for _ in range(cases_per_kind):
        h = int(torch.randint(0, q.shape[0], (1,), generator=gen))
        n = int(torch.randint(band + 8, n_tokens, (1,), generator=gen))
        m_pos = int(torch.randint(band, n, (1,), generator=gen))
        scores = (k[h // groups, :n + 1].double() @ q[h, n].double()) * scaling
        vals = v[h // groups, :n + 1]
        lo_band, lo_tail = m_pos + 1 - band, n + 1 - band
        prefix = range_state(scores, vals, 0, lo_band)
        band_s = range_state(scores, vals, lo_band, lo_tail)
        tail = range_state(scores, vals, lo_tail, n + 1)
        pb = range_state(scores, vals, 0, lo_tail)
        full = range_state(scores, vals, 0, n + 1)
        for op, st1, st2, want in ((MergeOp.MERGE, prefix, band_s, pb), (MergeOp.MERGE, pb, tail, full),
                                   (MergeOp.DOWNDATE, full, tail, pb)):
            r1, r2 = state_to_raw(*st1[:3], cfg), state_to_raw(*st2[:3], cfg)
            cases.append((op, r1[0], r1[1], r1[2].tolist(), r2[0], r2[1], r2[2].tolist()))
            expect_o.append(want[2].float())
            expect_lse.append(want[3])
    head = {"q": q[0].half(), "k": k[0].half(), "v": v[0].half(), "layer": layer, "query_head": 0,
            "command": "python -m benchmarks.record_mac_trace"}
    return {"q_pre": q_pre.half(), "layer": layer, "tokens": n_tokens, "merge_cases": cases,
            "expect_o": torch.stack(expect_o), "expect_lse": torch.tensor(expect_lse),
            "command": "python -m benchmarks.record_mac_trace"}, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=640)
    parser.add_argument("--layer", type=int, default=12)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--head-out", type=Path, default=DEFAULT_HEAD_OUT)
    args = parser.parse_args()
    trace, head = record(args.tokens, args.layer)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(trace, args.out)
    torch.save(head, args.head_out)
    q = trace["q_pre"].float()
    print(f"wrote {args.out}: q_pre {tuple(q.shape)} (|q| max {q.abs().max():.2f}, rms {q.pow(2).mean().sqrt():.2f}), "
          f"{len(trace['merge_cases'])} merge/removal cases from layer {args.layer}; {args.head_out}: "
          f"q/k/v {tuple(head['q'].shape)}, |k| max {head['k'].float().abs().max():.2f}, "
          f"|v| max {head['v'].float().abs().max():.2f}")


if __name__ == "__main__":
    main()
