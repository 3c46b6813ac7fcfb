"""MAC inside SmolLM2 at long context: rectification-distance (band S) and window (M) ablations.

One model load, the full-attention baseline once, then each variant teacher-forced over the same
tokens (``--tokens`` scored after a ``--context`` prefill); the JSON is rewritten after every variant
(a long run can be stopped and still report what it finished). ``--hardware`` runs the decode
engine's bit-accurate model (``mac-decode``) instead of the float reference.

    python -m benchmarks.mac_decode_ablation --context 4095 --tokens 128 --bands 0,16,32,64,256 \\
        --windows 512,1024,2048,4096 --out build/results/mac_ablation_4096.json --plot docs/img
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from golden.cli import add_overrides, configure_or_exit
from golden.llm.plots import pyplot, save


def variants(bands: list[int], windows: list[int]) -> list[dict]:
    """The band sweep at the default window, then the window sweep at the default band (the shared
    default point once)."""
    out = [{"band": b, "window": 512} for b in bands]
    out += [{"band": 256, "window": w} for w in windows if {"band": 256, "window": w} not in out]
    return out


def plot(results: dict, folder: Path) -> list[Path]:
    plt = pyplot()
    rows = results["variants"]
    paths = []
    for key, fixed, label in (("band", ("window", 512), "rectification distance S (band)"),
                              ("window", ("band", 256), "window M")):
        pts = sorted((r[key], r) for r in rows if r[fixed[0]] == fixed[1])
        if len(pts) < 2:
            continue
        x = [p[0] for p in pts]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
        ax[0].plot(x, [p[1]["perplexity_delta_pct"] for p in pts], "o-")
        ax[0].axhline(0, color="gray", lw=0.5)
        ax[0].set_xlabel(label)
        ax[0].set_ylabel("perplexity vs full attention (%)")
        ax[1].plot(x, [100 * p[1]["stats"]["hit_rate"] for p in pts], "o-", label="hit rate")
        ax[1].plot(x, [100 * p[1]["stats"]["skip_ratio"] for p in pts], "s-", label="KV skipped")
        ax[1].set_xlabel(label)
        ax[1].set_ylabel("%")
        ax[1].legend()
        if key == "window" or max(x) > 64:
            for a in ax:
                a.set_xscale("symlog", linthresh=16)
        fig.suptitle(f"MAC in SmolLM2-135M, {results['tokens']} tokens after {results['context']} context "
                     f"({'bit-accurate' if results['hardware'] else 'float'})")
        paths.append(save(fig, folder / f"decode_mac_ablation_{key}_{results['context'] + 1}.png"))
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4095)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--bands", default="0,16,32,64,256")
    p.add_argument("--windows", default="512,1024,2048,4096")
    p.add_argument("--hardware", action="store_true")
    add_overrides(p, "a MacConfig (--hardware: MacDecodeConfig) parameter every variant starts from")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    from golden.llm.data import wikitext_ids
    from golden.llm.hooks import Controller
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, load_model, teacher_forced
    from golden.mac_decode import MacDecodeConfig
    from golden.mac_ref import MacConfig

    base = configure_or_exit("mac_decode_ablation", MacDecodeConfig() if args.hardware else MacConfig(), args.set)
    t0 = time.time()
    model, tokenizer = load_model()
    ctl = Controller(model)
    seq = wikitext_ids(tokenizer, args.context + args.tokens + 1)
    nll_full, _ = full_parallel(ctl, seq, args.context)
    p_full = perplexity(nll_full)
    res = {"command": "python -m benchmarks.mac_decode_ablation " + " ".join(argv or os.sys.argv[1:]),
           "context": args.context, "tokens": args.tokens, "hardware": args.hardware,
           "perplexity_full": p_full, "variants": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for v in variants([int(b) for b in args.bands.split(",") if b], [int(w) for w in args.windows.split(",") if w]):
        t = time.time()
        cfg, method = replace(base, **v), "mac-decode" if args.hardware else "mac"
        nll, _, st = teacher_forced(ctl, seq, method, args.context, mac=cfg, progress=args.progress,
                                    desc=f"S={v['band']} M={v['window']}")
        p_mac = perplexity(nll)
        res["variants"].append({**v, "perplexity": p_mac, "perplexity_delta_pct": 100 * (p_mac / p_full - 1),
                                "stats": st, "seconds": time.time() - t})
        res["seconds"] = time.time() - t0
        args.out.write_text(json.dumps(res, indent=1))
        print(f"S={v['band']:4d} M={v['window']:5d}: ppl {p_mac:.4f} ({100 * (p_mac / p_full - 1):+.2f}% vs "
              f"{p_full:.4f}), hit {100 * st['hit_rate']:.1f}%, skip {100 * st['skip_ratio']:.1f}% "
              f"({time.time() - t:.0f} s)", flush=True)
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
        for path in plot(res, args.plot):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
