"""MAC reuse rules inside SmolLM2: perplexity against KV skipped per query head, over text offsets.

Each variant is a set of ``MacConfig`` overrides (``--set`` syntax, ``;`` between variants,
``default`` for none); each runs teacher-forced over the same tokens at every ``--offsets``
start (``--tokens`` scored after a ``--context`` prefill), against the full-attention baseline
of that offset. A variant's figure is the mean (and the spread) over the offsets: the reuse
chain makes single runs differ by a few tenths of a percent. The JSON is rewritten after every
run, so a stopped run keeps what it finished; ``--plot`` draws the Pareto plot (the default
marked). ``--hardware`` runs the decode engine's bit-accurate model (``MacDecodeConfig``).
``--merge A.json B.json`` joins runs made in parallel (one offset per process) into ``--out``.

    python -m benchmarks.mac_rules --context 7679 --tokens 512 --offsets 0,40000,80000 \\
        --variants 'default;tau=0.55;tau=0.6' --out build/results/mac_rules_8192.json --plot docs/img
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

from benchmarks.mac_hit_error import layer_list
from golden.cli import configure_or_exit
from golden.llm.plots import pyplot, save
from golden.mac_decode import MacDecodeConfig
from golden.mac_ref import MacConfig


def parse_variants(text: str) -> list[list[str]]:
    """``'default;a=1,b=2,c=3-4,7'`` -> ``[[], ['a=1', 'b=2', 'c=3-4,7']]`` (a comma starts a new
    override only where ``NAME=`` follows, so a value may be a list)."""
    out = []
    for v in text.split(";"):
        v = v.strip()
        if v:
            out.append([] if v == "default" else [p.strip() for p in re.split(r",(?=\s*\w+=)", v) if p.strip()])
    return out


def each_layer(variants: list[list[str]], layers: int) -> list[list[str]]:
    """Per variant, one variant per layer with reuse on in that layer only (``full_layers`` = the
    others): what each layer's reuse costs by itself (``benchmarks.mac_layers`` ranks them)."""
    return [ov + [f"full_layers={layer_list([x for x in range(layers) if x != lay])}"]
            for ov in variants for lay in range(layers)]


def label(config: dict, hardware: bool) -> str:
    """A variant's config as overrides of today's defaults (``default``: none), so that records
    taken under earlier defaults read the same."""
    base = (MacDecodeConfig() if hardware else MacConfig()).to_dict()
    return ",".join(f"{k}={v if v != '' else repr(v)}" for k, v in config.items()
                    if k in base and v != base[k]) or "default"


def summarize(runs: list[dict]) -> dict:
    """Mean, min and max over offsets of the perplexity change and the KV skipped per query head."""
    out = {}
    for key in ("perplexity_delta_pct", "head_skip_pct", "hit_pct", "kl_mnats"):
        xs = [r[key] for r in runs if key in r]
        if not xs:
            continue
        out[key] = {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}
    return out


def plot(res: dict, folder: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for v in res["variants"]:
        if not v["runs"]:
            continue
        s = v["summary"]
        x, y = s["head_skip_pct"]["mean"], s["perplexity_delta_pct"]["mean"]
        name = label(v["config"], res["hardware"])
        default = name == "default"
        color = "C3" if default else "C0"
        ax.errorbar(x, y, yerr=[[y - s["perplexity_delta_pct"]["min"]], [s["perplexity_delta_pct"]["max"] - y]],
                    fmt="*" if default else "o", ms=12 if default else 5, color=color, capsize=2,
                    mfc=color if len(v["runs"]) == len(res["offsets"]) else "none")   # hollow: not every offset
        ax.annotate(name, (x, y), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.0, color="gray", lw=0.6, ls="--")
    ax.axvline(50, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("KV skipped per query head (%)")
    ax.set_ylabel("perplexity vs full attention (%)")
    ax.set_title(f"MAC in SmolLM2-135M, {res['tokens']} scored after {res['context']} "
                 f"({'bit-accurate' if res['hardware'] else 'float'}, mean of {len(res['offsets'])} offsets; "
                 f"hollow: fewer)", fontsize=9)
    return save(fig, folder / f"decode_mac_rules_{res['context'] + res['tokens'] + 1}.png")


def merge(paths: list[Path]) -> dict:
    """One result of several runs of the same context, tokens and engine (variants matched by config)."""
    parts = [json.loads(Path(q).read_text()) for q in paths]
    res = {k: parts[0][k] for k in ("context", "tokens", "hardware")}
    if any((r["context"], r["tokens"], r["hardware"]) != (res["context"], res["tokens"], res["hardware"]) for r in parts):
        raise SystemExit("--merge: the files differ in context, tokens or engine")
    res.update(command=[r["command"] for r in parts], offsets=[], full={}, variants=[])
    rows: dict[tuple, dict] = {}
    for r in parts:
        res["offsets"] += [o for o in r["offsets"] if o not in res["offsets"]]
        res["full"].update(r["full"])
        for v in r["variants"]:
            row = rows.setdefault(json.dumps(v["config"], sort_keys=True),
                                  {"overrides": v["overrides"], "config": v["config"], "runs": []})
            row["runs"] += [run for run in v["runs"] if run["offset"] not in {x["offset"] for x in row["runs"]}]
    for row in rows.values():
        row["runs"].sort(key=lambda run: run["offset"])
        if row["runs"]:
            row["summary"] = summarize(row["runs"])
    res["variants"] = list(rows.values())
    return res


def print_summary(res: dict) -> None:
    print(f"\n{'variant':<40}{'runs':>5}{'ppl mean':>10}{'min':>8}{'max':>8}{'KL mnat':>9}{'skip/head':>11}{'hits':>7}")
    for row in res["variants"]:
        if not row["runs"]:
            continue
        s = row["summary"]
        print(f"{label(row['config'], res['hardware']):<40}{len(row['runs']):>5}"
              f"{s['perplexity_delta_pct']['mean']:>+9.2f}%{s['perplexity_delta_pct']['min']:>+7.2f}%"
              f"{s['perplexity_delta_pct']['max']:>+7.2f}%{s.get('kl_mnats', {}).get('mean', float('nan')):>9.2f}"
              f"{s['head_skip_pct']['mean']:>10.1f}%{s['hit_pct']['mean']:>6.1f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4095)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--offsets", default="0,40000,80000", help="text offsets (tokens) of the runs")
    p.add_argument("--variants", default="default", help="';'-separated override sets ('default': none)")
    p.add_argument("--each-layer", action="store_true",
                   help="run each variant once per layer, reuse on in that layer only")
    p.add_argument("--hardware", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="join these result files into --out (and --plot) instead of running")
    args = p.parse_args(argv)
    if args.merge:
        res = merge(args.merge)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))
        print_summary(res)
        if args.plot:
            args.plot.mkdir(parents=True, exist_ok=True)
            print(f"wrote {plot(res, args.plot)}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    from golden.llm.data import wikitext_ids
    from golden.llm.hooks import Controller
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, load_model, teacher_forced

    offsets = [int(o) for o in args.offsets.split(",") if o.strip()]
    base, method = (MacDecodeConfig(), "mac-decode") if args.hardware else (MacConfig(), "mac")
    from golden.llm.decode_eval import MODEL_LAYERS
    overrides = parse_variants(args.variants)
    if args.each_layer:
        overrides = each_layer(overrides, MODEL_LAYERS)
    variants = [(ov, configure_or_exit("mac_rules", base, ov)) for ov in overrides]   # before the model loads
    t0 = time.time()
    model, tokenizer = load_model()
    ctl = Controller(model)
    n = args.context + args.tokens + 1
    ids = wikitext_ids(tokenizer, max(offsets) + n)
    res = {"command": "python -m benchmarks.mac_rules " + " ".join(argv or os.sys.argv[1:]),
           "context": args.context, "tokens": args.tokens, "offsets": offsets, "hardware": args.hardware,
           "full": {}, "variants": [{"overrides": ov, "config": cfg.to_dict(), "runs": []} for ov, cfg in variants]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for off in offsets:
        seq = ids[off:off + n]
        nll_full, logits_full = full_parallel(ctl, seq, args.context, keep_logits=True)
        logp_full = torch.log_softmax(logits_full, -1)
        p_full = perplexity(nll_full)
        res["full"][str(off)] = p_full
        for (ov, cfg), row in zip(variants, res["variants"]):
            t = time.time()
            nll, logits, st = teacher_forced(ctl, seq, method, args.context, mac=cfg, keep_logits=True,
                                             progress=args.progress, desc=f"{','.join(ov) or 'default'} @{off}")
            p_mac = perplexity(nll)
            kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), logp_full, log_target=True,
                                            reduction="batchmean")
            row["runs"].append({"offset": off, "perplexity": p_mac, "perplexity_delta_pct": 100 * (p_mac / p_full - 1),
                                "head_skip_pct": 100 * st["head_skip_ratio"], "hit_pct": 100 * st["hit_rate"],
                                "kl_mnats": 1000 * float(kl), "stats": st, "seconds": time.time() - t})
            row["summary"] = summarize(row["runs"])
            res["seconds"] = time.time() - t0
            args.out.write_text(json.dumps(res, indent=1))
            r = row["runs"][-1]
            print(f"{','.join(ov) or 'default':<40} @{off:>6}: ppl {r['perplexity_delta_pct']:+.2f}%, "
                  f"KL {r['kl_mnats']:.2f} mnat, skip/head {r['head_skip_pct']:.1f}%, hits {r['hit_pct']:.1f}% ({r['seconds']:.0f} s)", flush=True)
    print_summary(res)
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
        print(f"wrote {plot(res, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
