"""MAC inside SmolLM2 vs context length: perplexity vs full attention, hit rate and KV skipped, from
``ladmac eval mac --out`` JSON runs (one point per run, at the run's last scored context), plus the
per-step hit / skip curves of each run.

    python -m benchmarks.mac_decode_context build/results/mac_hardware_2048.json \\
        build/results/mac_4096.json build/results/mac_8192.json --plot docs/img
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from golden.llm.plots import pyplot, save


def points(paths: list[Path]) -> list[dict]:
    out = []
    for path in paths:
        r = json.loads(path.read_text())
        a = r["args"]
        for name, st in r["teacher_forced_stats"].items():
            out.append({"run": path.stem, "variant": name, "context_end": a["context"] + a["tokens"] + 1,
                        "context_start": a["context"] + 1, "tokens": a["tokens"],
                        "perplexity": r["perplexity"][name], "perplexity_full": r["perplexity"]["full"],
                        "delta_pct": r["perplexity_delta_pct"][name], "hit_rate": st.get("hit_rate"),
                        "skip_ratio": st.get("skip_ratio"), "steps": r.get("steps") if name == "mac" else
                        r.get("steps_hardware")})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    pts = points(args.results)
    print("| run | variant | scored contexts | perplexity | full | vs full | hit rate | KV skipped |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for q in pts:
        print(f"| {q['run']} | {q['variant']} | {q['context_start']}..{q['context_end'] - 1} | {q['perplexity']:.3f} | "
              f"{q['perplexity_full']:.3f} | {q['delta_pct']:+.2f}% | {100 * q['hit_rate']:.1f}% | "
              f"{100 * q['skip_ratio']:.1f}% |")
    if args.plot:
        plt = pyplot()
        fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
        for q in pts:
            if q["steps"]:
                ctx = [s["context"] for s in q["steps"]]
                hit = [s["hits"] / s["heads"] if s.get("misses", 0) + s["hits"] else float("nan") for s in q["steps"]]
                skip = [1 - s["kv_read"] / s["kv_total"] for s in q["steps"]]
                ax[1].plot(ctx, hit, lw=0.5, label=f"hit rate {q['variant']} ({q['run']})")
                ax[1].plot(ctx, skip, lw=0.5, label=f"KV skipped {q['variant']} ({q['run']})")
        for variant in sorted({q["variant"] for q in pts}):
            sel = sorted((q["context_end"], q["delta_pct"]) for q in pts if q["variant"] == variant)
            ax[0].plot([s[0] for s in sel], [s[1] for s in sel], "o-", label=variant)
        ax[0].axhline(1.5, color="red", lw=0.6, ls="--", label="target +1.5 %")
        ax[0].axhline(0, color="gray", lw=0.5)
        ax[0].set_xlabel("context at the end of the scored tokens")
        ax[0].set_ylabel("perplexity vs full attention (%)")
        ax[0].legend(fontsize=7)
        ax[1].axhline(0.9, color="red", lw=0.6, ls="--")
        ax[1].axhline(0.85, color="orange", lw=0.6, ls="--")
        ax[1].set_xlabel("context (keys)")
        ax[1].set_ylabel("per decode step")
        ax[1].legend(fontsize=6)
        print(f"wrote {save(fig, args.plot / 'decode_mac_context.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
