"""LAD tile vs the dense PWL baseline on real SmolLM2 decode sequences: KV bytes and cycles per step.

    .venv/bin/python -m benchmarks.lad_vs_dense [--contexts 512 1024 2048 4096] [--heads 3:0 12:4 25:8]
        [--rtl-steps 512] [--plot docs/img/lad_vs_dense.png] [--out build/results/lad_vs_dense.json]

For each (layer, query head) the script records q, k, v of the first max(contexts) WikiText-2
tokens (benchmarks/record_lad_trace.py), then:

1. runs the bit-accurate tile model (golden/lad_tile.py, bit-exact with the RTL on every step's
   statistics) over the whole sequence: KV beats read, candidates, actives, false alarms and
   centers at each context;
2. runs the LAD tile RTL under Verilator on the first ``rtl-steps`` steps of the first head
   (no stream gaps, no back-pressure, one-cycle KV memory: the tile's own cost), checking every
   step bit-exactly, and the dense baseline RTL at the same contexts: measured cycles per step;
3. for contexts beyond ``rtl-steps``, cycles come from a linear model of the RTL's cycle count in
   the step's statistics (position, candidates, actives, mode changes, centers) fitted to the
   measured steps; the fit's error on those steps is printed. Such rows are marked "model".

KV bytes per step: LAD reads the candidates' keys and the actives' values (``beats * lanes * 2``
bytes each); dense reads every key and value. Both get the new token's k, v with the step.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from golden.dense import DenseConfig
from golden.lad_tile import LadTileConfig, LadTileModel
from testbenches.runner import simulate

FEATURES = ("position", "candidates", "active", "mode_changes", "centers")


def golden_stats(cfg: LadTileConfig, q, k, v, contexts, desc: str):
    from tqdm import tqdm
    model = LadTileModel(cfg)
    out = []
    for i in tqdm(range(q.shape[0]), desc=desc, leave=False):
        _, st = model.step(q[i], k[i], v[i])
        out.append(st)
    return out


def fit_cycles(stats: list[dict], cycles: list[int]):
    """Least-squares cycles ~ c0 + sum c_f * feature_f over the measured steps."""
    X = torch.tensor([[1.0] + [float(s[f]) for f in FEATURES] for s in stats], dtype=torch.float64)
    y = torch.tensor(cycles, dtype=torch.float64)
    coef = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1)
    pred = X @ coef
    rel = ((pred - y).abs() / y.clamp_min(1)).max().item()
    return coef, rel


def predict(coef, st: dict) -> float:
    return float(coef[0] + sum(coef[j + 1] * st[f] for j, f in enumerate(FEATURES)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--heads", nargs="+", default=["3:0", "12:4", "25:8"], help="LAYER:QUERY_HEAD pairs")
    parser.add_argument("--rtl-steps", type=int, default=512, help="steps simulated in RTL (first head)")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from benchmarks.record_lad_trace import record_heads
    t0 = time.time()
    cfg, dense_cfg = LadTileConfig(), DenseConfig()
    top = max(args.contexts)
    pairs = tuple(tuple(int(x) for x in s.split(":")) for s in args.heads)
    trace = record_heads(top, pairs)
    f = cfg.kv_format
    bytes_per_beat = cfg.lanes * cfg.kv_width // 8
    results = {"config": cfg.to_dict(), "contexts": args.contexts, "heads": [list(p) for p in pairs], "rows": []}

    # RTL: LAD tile on the first rtl-steps of head 0, and dense at the same contexts
    head0 = [f.quantize(trace[n][0, :args.rtl_steps]) for n in ("q", "k", "v")]
    path = (Path("build") / "results" / "lad_bench_trace.pt").resolve()   # the simulator runs elsewhere
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({n: trace[n][:1, :args.rtl_steps].half() for n in ("q", "k", "v")}, path)
    rep = simulate("lad-tile", cfg, "testbenches.tb.tb_lad_tile", seed=7, name="bench",
                   params={"trace": str(path), "head": 0, "steps": args.rtl_steps, "gap": 0.0, "stall": 0.0,
                           "latency": [1, 1]})
    assert rep["mismatches"] == 0, "RTL differs from the bit-accurate model"
    rtl_cycles = rep["step_cycles"]
    print(f"LAD tile RTL: {args.rtl_steps} steps of head {pairs[0]} bit-exact; "
          f"{sum(rtl_cycles)} cycles in all ({time.time() - t0:.0f} s so far)", flush=True)
    dense_cycles = {}
    for n in sorted({c for c in args.contexts}):
        d = simulate("dense", dense_cfg, "testbenches.tb.tb_dense", seed=5, name=f"bench{n}",
                     params={"steps": 1, "max_len": n, "fixed_len": n, "gap": 0.0, "stall": 0.0, "latency": [1, 1]})
        dense_cycles[n] = d["step_cycles"][0]

    print("| head (layer:q) | context | LAD KV bytes/step | dense KV bytes/step | KV ratio | candidates % | "
          "active % | false alarms % | centers | LAD cycles | dense cycles | cycle ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    coef = None
    for h, pair in enumerate(pairs):
        q, k, v = (f.quantize(trace[n][h]) for n in ("q", "k", "v"))
        stats = golden_stats(cfg, q, k, v, args.contexts, f"golden {pair}")
        if h == 0:
            coef, fit_err = fit_cycles(stats[:args.rtl_steps], rtl_cycles)
            results["cycle_model"] = {"features": ["1", *FEATURES], "coef": coef.tolist(), "max_rel_error": fit_err}
        for n in args.contexts:
            st = stats[n - 1]                     # the step whose context (keys incl. the new one) is n
            lad_bytes = st["kv_beats"] * bytes_per_beat
            dense_bytes = 2 * n * dense_cfg.beats * bytes_per_beat
            measured = h == 0 and n - 1 < len(rtl_cycles)
            lad_cyc = rtl_cycles[n - 1] if measured else predict(coef, st)
            pos = max(1, st["position"])
            row = {"head": list(pair), "context": n, "lad_kv_bytes": lad_bytes, "dense_kv_bytes": dense_bytes,
                   "candidates_pct": 100 * st["candidates"] / pos, "active_pct": 100 * st["active"] / pos,
                   "false_alarm_pct": 100 * st["false_alarms"] / pos, "centers": st["centers"],
                   "lad_cycles": lad_cyc, "lad_cycles_measured": measured, "dense_cycles": dense_cycles[n]}
            results["rows"].append(row)
            print(f"| {pair[0]}:{pair[1]} | {n} | {lad_bytes} | {dense_bytes} | {lad_bytes / dense_bytes:.3f} | "
                  f"{row['candidates_pct']:.1f} | {row['active_pct']:.1f} | {row['false_alarm_pct']:.1f} | "
                  f"{st['centers']} | {lad_cyc:.0f}{'' if measured else ' (model)'} | {dense_cycles[n]} | "
                  f"{lad_cyc / dense_cycles[n]:.3f} |", flush=True)
    print(f"cycle model fitted on {len(rtl_cycles)} RTL steps: max relative error {results['cycle_model']['max_rel_error']:.3f}; "
          f"coefficients {dict(zip(results['cycle_model']['features'], [round(c, 2) for c in coef.tolist()]))}")
    print(f"wall time {time.time() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for pair in pairs:
            rows = [r for r in results["rows"] if r["head"] == list(pair)]
            ctx = [r["context"] for r in rows]
            axes[0].plot(ctx, [r["lad_kv_bytes"] / 1024 for r in rows], "o-", label=f"LAD L{pair[0]}H{pair[1]}")
            axes[1].plot(ctx, [r["lad_cycles"] for r in rows], "o-", label=f"LAD L{pair[0]}H{pair[1]}")
        rows = [r for r in results["rows"] if r["head"] == list(pairs[0])]
        axes[0].plot([r["context"] for r in rows], [r["dense_kv_bytes"] / 1024 for r in rows], "k--", label="dense")
        axes[1].plot([r["context"] for r in rows], [r["dense_cycles"] for r in rows], "k--", label="dense")
        axes[0].set_ylabel("KV KiB read per step")
        axes[1].set_ylabel("cycles per step")
        for ax in axes:
            ax.set_xlabel("context")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        fig.suptitle("LAD tile vs dense PWL baseline, SmolLM2-135M WikiText-2 (d=64, 8 lanes)", fontsize=9)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
