"""PNG figures of the evaluations: ``ladmac eval lad|mac`` (perplexity per variant; MAC's hit
rate and skip ratio against context) and ``ladmac eval attncache`` (Spearman and hit rate
against theta)."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (imported on first use)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, write (creating the folder) and close ``fig``; returns ``path``."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path

def text_name(r: dict) -> str:
    """A run's text for a plot title: WikiText-2, or the file name of another text (``r["data"]``)."""
    data = r.get("data", "WikiText-2")
    return "WikiText-2" if data.startswith("WikiText-2") else Path(data).name


def decode_plots(method: str, r: dict, folder: Path) -> list[Path]:
    """PNG plots: perplexity per variant; for MAC also hit rate / skip ratio vs context."""
    plt = pyplot()
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
    ax.set_title(f"{method.upper()} vs full attention, SmolLM2-135M, {text_name(r)}\n"
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
        ax.set_title(f"MAC on SmolLM2-135M, teacher-forced {text_name(r)} (thin: per step)", fontsize=9)
        fig.tight_layout()
        p = folder / "decode_mac_hit_skip.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def attncache_plots(result: dict, folder) -> list[str]:
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [r for r in result["sweep"] if r["theta"] > 0]
    th = [r["theta"] for r in rows]
    x = [1.0 - t + 1e-5 for t in th]
    paths = []
    metric = result.get("metric", "spearman")
    task = result.get("task", "stsb")
    title = {"stsb": "STS-B dev", "sst2": "SST-2 dev"}.get(task, task)
    stem = f"attncache_{result['model']}" + ("" if task == "stsb" else f"_{task}")
    for key, ylabel, fname in ((metric, f"{title} {metric}" + (" x100" if metric == "spearman" else " %"), metric),
                               ("hit_rate", "hit rate", "hitrate")):
        fig, ax = plt.subplots(figsize=(5, 3.4))
        ax.plot(x, [r[key] for r in rows], "o-", label="AttnCache")
        if key == metric:
            ax.axhline(result[f"full_{metric}"], color="gray", ls="--", label="full model")
            ax.legend()
        ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{t:g}" for t in th], rotation=45, fontsize=7)
        ax.set_xlabel("theta (similarity = 1 - " + ("squared " if result["config"].get("similarity", "sqdist")
                                                      == "sqdist" else "") + "L2 of features)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"AttnCache, {result['model']}, {title}")
        fig.tight_layout()
        path = folder / f"{stem}_{fname}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths
