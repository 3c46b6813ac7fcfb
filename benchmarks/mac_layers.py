"""Which layers MAC should reuse in: each layer's cost measured alone, ranked, and the
``full_layers`` that keeps a target share of the KV skipped.

Input: ``benchmarks.mac_rules --each-layer`` results (one run per layer with reuse on in that
layer only), at one or more contexts, on text no evaluation scores. A layer's cost is the KL
divergence of the model's next-token distribution from full attention's (mean over the scored
tokens, millinats), summed over the files; its gain is the KV it skips per query head at the
longest context. Layers are taken in order of cost per gain until their skip reaches
``--skip``; the others are printed as ``full_layers`` (docs/results_decode.md, "Choosing the
layers"):

    python -m benchmarks.mac_rules --context 3839 --tokens 256 --offsets 160000 --each-layer \\
        --variants default --out build/results/layers_4096.json
    python -m benchmarks.mac_layers build/results/layers_4096.json build/results/layers_8192.json --skip 55

``--plot DIR`` draws each layer's KL per file and marks the layers chosen.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.mac_hit_error import layer_list
from golden.llm.decode_eval import MODEL_LAYERS
from golden.llm.plots import pyplot, save
from golden.mac_ref import layer_set


def per_layer(res: dict, layers: int) -> dict[int, dict]:
    """layer -> {kl, ppl, skip} (means over offsets) of the variants that reuse in one layer only."""
    out = {}
    for v in res["variants"]:
        full = v["config"].get("full_layers")
        if full is None or not v["runs"]:
            continue
        on = set(range(layers)) - layer_set(full)
        if len(on) == 1:
            s = v["summary"]
            out[on.pop()] = {"kl": s["kl_mnats"]["mean"], "ppl": s["perplexity_delta_pct"]["mean"],
                             "skip": s["head_skip_pct"]["mean"]}
    return out


def per_skip(costs: dict[int, float], skips: dict[int, float]) -> dict[int, float]:
    """Cost per skipped share of each layer."""
    return {x: costs[x] / max(skips[x], 1e-9) for x in costs}


def choose(costs: dict[int, float], skips: dict[int, float], target: float) -> list[int]:
    """Layers in order of cost per skipped share until their skips sum to ``target``."""
    ratio = per_skip(costs, skips)
    order = sorted(costs, key=ratio.get)
    kept, total = [], 0.0
    for x in order:
        if total >= target:
            break
        kept.append(x)
        total += skips[x]
    return kept


def plot(runs: list[dict], tables: list[dict], kept: list[int], folder: Path) -> Path:
    """Bars of each layer's KL (one colour per file), the layers kept for reuse starred."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    layers = sorted(set().union(*tables))
    width = 0.8 / len(tables)
    for i, (r, t) in enumerate(zip(runs, tables)):
        xs = [x for x in layers if x in t]
        ax.bar([x + (i - (len(tables) - 1) / 2) * width for x in xs], [t[x]["kl"] for x in xs], width,
               label=f"{r['context'] + r['tokens'] + 1} tokens")
    top = max(t[x]["kl"] for t in tables for x in t)
    ax.plot(kept, [top * 1.05] * len(kept), "k*", ms=5, label="reuse kept")
    ax.set_xticks(layers)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_xlabel("layer (reuse on in this layer only)")
    ax.set_ylabel("KL(full || MAC), millinats")
    ax.legend(fontsize=7)
    ax.set_title("MAC in SmolLM2-135M: what each layer's reuse costs", fontsize=9)
    return save(fig, folder / "decode_mac_layers.png")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="+", help="mac_rules --each-layer JSON files")
    p.add_argument("--skip", type=float, default=55.0, help="KV skipped per query head to keep (%%, longest context)")
    p.add_argument("--layers", type=int, default=MODEL_LAYERS)
    p.add_argument("--plot", type=Path, default=None, help="folder for decode_mac_layers.png")
    args = p.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.results]
    tables = [per_layer(r, args.layers) for r in runs]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    longest = max(range(len(runs)), key=lambda i: runs[i]["context"])
    costs = {x: sum(t[x]["kl"] for t in tables) for x in common}
    skips = {x: tables[longest][x]["skip"] for x in common}
    heads = "".join(f"{'KL@' + str(r['context'] + r['tokens'] + 1):>11}{'ppl':>8}" for r in runs)
    print(f"{'layer':>5}{heads}{'skip':>8}{'KL/skip':>9}")
    ratio = per_skip(costs, skips)
    for x in sorted(common, key=ratio.get):
        cols = "".join(f"{t[x]['kl']:>11.2f}{t[x]['ppl']:>+7.2f}%" for t in tables)
        print(f"{x:>5}{cols}{skips[x]:>7.2f}%{ratio[x]:>9.2f}")
    kept = choose(costs, skips, args.skip)
    print(f"\nreuse in {len(kept)} layers ({layer_list(kept)}): skip {sum(skips[x] for x in kept):.1f}% "
          f"(sum of one-layer runs), KL {sum(costs[x] for x in kept):.2f} mnat (summed over the files)")
    print(f"full_layers={layer_list([x for x in range(args.layers) if x not in kept])}")
    if len(common) < args.layers:
        print(f"(only {len(common)} of {args.layers} layers measured in every file)")
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
        print(f"wrote {plot(runs, tables, kept, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
