"""What a MAC hit costs, per layer: the relative error of MAC's attention output against full
attention on every hit, by match distance, with the model itself running on full attention.

SmolLM2 runs teacher-forced on full attention; at every decode step each layer also runs MAC's
float reference on the same q, k, v (its ring and entries evolve as in a MAC run) and records,
per query head, the match distance, whether it hit and ``||o_mac - o_full|| / ||o_full||``. The
table gives, per layer, the hit rate, the mean and 90th-percentile error of hits, the median
match distance and the correlation of distance and error; then the error by distance band over
all layers. This separates what a threshold on the distance can fix from what it cannot.

It also calibrates ``MacConfig.full_layers``: ``--full-top K`` prints the ``K`` layers of highest
mean hit error as a ``full_layers`` value, measured on a slice of the text that no evaluation
scores (docs/results_decode.md, "The reuse rule"):

    python -m benchmarks.mac_hit_error --context 7679 --tokens 256 --offset 160000 --set full_layers= \
        --full-top 10 --out build/results/mac_hit_error_cal.json
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from golden.cli import configure


def layer_list(layers: list[int]) -> str:
    """``[6, 7, 8, 17]`` -> ``'6-8,17'`` (a ``full_layers`` value)."""
    runs: list[list[int]] = []
    for x in sorted(layers):
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def table(rows: list[dict]) -> dict:
    """Per layer and per distance band: hits, mean and p90 error of hits, median distance."""
    dist = torch.tensor([r["dist"] for r in rows], dtype=torch.float64)      # (records, heads)
    hit = torch.tensor([r["hit"] for r in rows])
    err = torch.tensor([r["err"] for r in rows], dtype=torch.float64)
    layer = torch.tensor([r["layer"] for r in rows])[:, None].expand_as(dist)
    out = {"layers": [], "bands": []}
    for lay in range(int(layer.max()) + 1):
        m = layer == lay
        d, e = dist[m & hit], err[m & hit]
        corr = float(torch.corrcoef(torch.stack([d, e]))[0, 1]) if d.numel() > 2 else float("nan")
        out["layers"].append({"layer": lay, "hit_pct": 100 * float(hit[m].float().mean()),
                              "err_mean": float(e.mean()) if e.numel() else 0.0,
                              "err_p90": float(e.quantile(0.9)) if e.numel() else 0.0,
                              "dist_median": float(dist[m].median()), "corr": corr})
    edges = [0, 0.5, 1, 2, 3, 4, 5, float("inf")]
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = hit & (dist >= lo) & (dist < hi)
        if m.any():
            out["bands"].append({"dist_lo": lo, "dist_hi": hi if hi != float("inf") else None, "hits": int(m.sum()),
                                 "err_mean": float(err[m].mean()), "err_median": float(err[m].median())})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=7679)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a MacConfig parameter")
    p.add_argument("--full-top", type=int, default=None, metavar="K",
                   help="print the K layers of highest mean hit error as a full_layers value")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    from transformers import DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from golden.llm.data import wikitext_ids
    from golden.llm.hooks import Controller
    from golden.llm.runs import load_model
    from golden.mac_ref import MacConfig, match

    cfg = configure(MacConfig(), args.set)
    rows: list[dict] = []

    class Shadow(Controller):
        """MAC beside full attention: MAC's states advance, full attention's output goes on."""
        def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
            B, Hq, Sq, D = query.shape
            if self.method != "mac" or Sq > 1:
                return super().attention(module, query, key, value, attention_mask, scaling, dropout, **kw)
            st = self.states.get(module.layer_idx)
            q_pre = self.q_pre[module.layer_idx].view(-1, Hq, D)[-1].double()
            engaged = st is not None and key.shape[2] >= cfg.min_context
            if engaged:
                hit, _, dist = match(st.ring_q, st.ring_pos, st.entry_valid, q_pre, cfg.threshold(D))
            o_mac, _ = super().attention(module, query, key, value, attention_mask, scaling, dropout, **kw)
            o_full, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                               dropout=dropout, **kw)
            if engaged:
                a, b = o_mac.reshape(Hq, D).double(), o_full.reshape(Hq, D).double()
                rows.append({"n": key.shape[2], "layer": module.layer_idx, "dist": dist.tolist(),
                             "hit": hit.tolist(), "err": ((a - b).norm(dim=-1) / b.norm(dim=-1)).tolist()})
            return o_full, None

    model, tokenizer = load_model()
    ctl = Shadow(model)
    n = args.context + args.tokens + 1
    ids = wikitext_ids(tokenizer, args.offset + n)[args.offset:args.offset + n].reshape(1, -1)
    ctl.start("mac", mac=cfg)
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :args.context], past_key_values=cache, use_cache=True)
        for t in range(args.context, n - 1):
            model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            ctl.end_token(t + 1)
    ctl.detach()
    res = {"command": "python -m benchmarks.mac_hit_error " + " ".join(argv or os.sys.argv[1:]),
           "config": cfg.to_dict(), **table(rows)}
    if args.full_top is not None:
        worst = sorted(res["layers"], key=lambda r: -r["err_mean"])[:args.full_top]
        res["full_layers"] = layer_list([r["layer"] for r in worst])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"{'layer':>5}{'hits':>7}{'err mean':>10}{'err p90':>9}{'dist p50':>10}{'corr':>7}")
    for r in res["layers"]:
        print(f"{r['layer']:>5}{r['hit_pct']:>6.1f}%{r['err_mean']:>10.3f}{r['err_p90']:>9.3f}"
              f"{r['dist_median']:>10.3f}{r['corr']:>7.2f}")
    print(f"\n{'distance':>12}{'hits':>8}{'err mean':>10}{'median':>8}")
    for b in res["bands"]:
        hi = f"{b['dist_hi']:.1f}" if b["dist_hi"] is not None else ""
        print(f"{b['dist_lo']:>5.1f}-{hi:<6}{b['hits']:>8}{b['err_mean']:>10.3f}{b['err_median']:>8.3f}")
    if "full_layers" in res:
        print(f"\nthe {args.full_top} layers of highest mean hit error: full_layers={res['full_layers']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
