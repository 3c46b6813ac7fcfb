"""LAD tile vs the dense PWL baseline on real SmolLM2 decode sequences: KV bytes and cycles per step.

    .venv/bin/python -m benchmarks.lad_vs_dense [--contexts 128 256 512 1024 2048 4096]
        [--heads 3:0 7:2 10:6 12:4 15:1 19:7 22:3 25:8] [--rtl-steps 512 0 0 512 0 512 0 0] [--window 64]
        [--plot docs/img/lad_vs_dense.png] [--out build/results/lad_vs_dense.json] [--reuse-rtl JSON]
        [--set NAME=VALUE ...]   (LadTileConfig overrides, e.g. max_centers=4096 eas_beats=1)

For each (layer, query head) the script records q, k, v of the first max(contexts) WikiText-2
tokens (benchmarks/record_lad_trace.py), then:

With ``--set group=G`` (a tile per KV group, docs/lad-tile.md) each ``--heads`` entry is
``LAYER:KV_HEAD``, the G query heads of that KV head are recorded and each row is the group's: its
tile's KV beats (each key and value read once for the group: the union of the heads' candidates and
actives), its schedule (``golden.lad_tile.schedule_cycles`` at ``group`` G) against the group-aware
dense tile (the dense RTL at ``group`` G, measured: one KV stream for the G heads).
``--rtl-steps`` runs the group tile's RTL on the group's
heads (its KV beats: its one port's, at least the union); the model's rows are the planned
schedule of the union.

1. runs the bit-accurate tile model (golden/lad_tile.py, bit-exact with the RTL on every step's
   statistics) over the whole sequence: KV beats read, candidates, actives, false alarms and
   centers of every step;
2. runs the LAD tile RTL under Verilator on the first ``rtl-steps[h]`` steps of head h (no
   stream gaps, no back-pressure, one-cycle KV memory: the tile's own cost), checking every
   step bit-exactly, and the dense baseline RTL at every context: measured cycles per step;
   ``--reuse-rtl`` takes those measured cycles from an earlier run's ``--out`` JSON instead
   (same heads and config, checked);
3. cycles of steps beyond the simulated ones come from the schedule's model
   ``golden.lad_tile.schedule_cycles`` (EAS's center pass + APID pass A + ``max(position, KV
   beats)`` for pass B, the q.A pass's wait at short contexts, a fixed part and a cost per mode
   change; the last two constants are fitted on the RTL's steps). The script prints the stored
   constants' error against every measured step at positions >= 16, a fresh least-squares fit of
   them, and an extrapolation check (fitted below position 256, checked on the steps beyond).
   Such figures are marked "model". (Simulating 4096 steps is ~10^8 cycles: out of reach for
   cocotb.)

4. the tile's own floor per step, the busiest unit at the configured parallelism:
   ``max(KV beats, eas_beats * centers + 2 * position, (d / ac_vpus) * beats * (2 + mode changes))``
   -- the KV port; EAS's center pass and APID's two passes (one position per cycle; they depend on
   each other: EAS -> pass A -> m -> pass B); AC's VPUs (the q.A pass, the absorption's and each
   mode change's update of cache A). ``cycles / floor`` is how far the schedule is from it.

Per-step figures swing a lot from one step to the next (a query that attends elsewhere makes
many positions change interval), so each row is the mean over the ``window`` steps ending at
that context. KV bytes per step: LAD reads the candidates' keys and the actives' values
(``beats * lanes * 2`` bytes each); dense reads every key and value. Both get the new token's
k, v with the step.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from golden.errors import ConfigError
from golden.lad_tile import LadTileConfig, schedule_constants, schedule_cycles
from testbenches.runner import simulate

DEFAULT_HEADS = ("3:0", "7:2", "10:6", "12:4", "15:1", "19:7", "22:3", "25:8")   # (layer, query head)
FIT_FROM = 16   # steps at positions below this are not fitted (fixed latencies overlap there)
EXTRAPOLATE_FROM = 256   # the extrapolation check: fitted below this position, checked at and above it


def golden_stats(cfg: LadTileConfig, q, k, v) -> list[list[dict]]:
    """Every step's statistics of every tile (a head, or a group of ``cfg.group`` consecutive heads):
    the batched bit-accurate model (golden/lad_batch.py, bit-exact with ``LadTileModel`` per head,
    tested), all heads stepping together. A group's row: its candidates and actives the union of its
    heads' (what its tile reads), false alarms the keys read whose value is not, its busiest head's
    mode changes. ``q, k, v``: raw kv-format ``(heads, steps, d)``."""
    from tqdm import tqdm
    from golden.lad_batch import LadTileBatch
    H, T, g = q.shape[0], q.shape[1], cfg.group
    model = LadTileBatch(cfg, H)
    out = [[] for _ in range(H // g)]
    for i in tqdm(range(T), desc="bit-accurate model", leave=False):
        _, st = model.step(q[:, i], k[:, i], v[:, i])
        for t in range(H // g):
            h = t * g
            row = {name: int(val[h]) for name, val in st.items() if name in STAT_NAMES}
            if g > 1:
                gc, ga = int(st["group_candidates"][h]), int(st["group_active"][h])
                row.update(candidates=gc, active=ga, false_alarms=gc - ga, kv_beats=cfg.beats * (gc + ga),
                           mode_changes=int(st["mode_changes"][h:h + g].max()))
            row["centers_before"] = row["centers"] - row["new_center"]
            out[t].append(row)
    return out


STAT_NAMES = ("position", "candidates", "active", "false_alarms", "mode_changes", "path", "centers",
              "new_center", "kv_beats")


def floor_cycles(cfg: LadTileConfig, st: dict) -> int:
    """The step's floor at the configured parallelism (module docstring, item 4): the busiest of the
    KV port, EAS + APID (dependent passes) and AC's VPUs."""
    eas_apid = cfg.eas_beats * st["centers_before"] + 2 * st["position"]
    ac = cfg.head_dim // cfg.ac_vpus * cfg.beats * (2 + st["mode_changes"])
    return max(st["kv_beats"], eas_apid, ac)


def model_cycles(cfg: LadTileConfig, stats: list[dict], fixed: float, per_change: float,
                 per_position: float = 0.0) -> torch.Tensor:
    """golden.lad_tile.schedule_cycles of every step, with the given constants."""
    col = {f: torch.tensor([float(st[f]) for st in stats], dtype=torch.float64)
           for f in ("position", "centers_before", "kv_beats", "mode_changes", "new_center")}
    return schedule_cycles(cfg, col["position"], col["centers_before"], col["kv_beats"], col["mode_changes"],
                           col["new_center"], constants=(fixed, per_change, per_position))


def fit_constants(cfg: LadTileConfig, stats: list[dict], cycles: list[int], use=None) -> tuple[float, float, float]:
    """Least-squares ``(fixed, per mode change, per position)`` of the schedule model on the steps in
    ``use`` (the per-position term for a group's tile only: one head's is 0)."""
    y = torch.tensor(cycles, dtype=torch.float64)
    base = model_cycles(cfg, stats, 0.0, 0.0)
    terms = ["mode_changes"] + (["position"] if cfg.group > 1 else [])
    X = torch.stack([torch.ones_like(y)] + [torch.tensor([float(st[t]) for st in stats], dtype=torch.float64)
                                            for t in terms], 1)
    use = torch.ones_like(y, dtype=torch.bool) if use is None else use
    sol = torch.linalg.lstsq(X[use], (y - base)[use].unsqueeze(1)).solution.squeeze(1).tolist()
    return tuple(sol + [0.0] * (3 - len(sol)))


def rel_errors(model: torch.Tensor, cycles: list[int], where) -> tuple[float, float]:
    y = torch.tensor(cycles, dtype=torch.float64)
    rel = ((model - y).abs() / y)[where]
    return rel.max().item(), rel.mean().item()


def rtl_cycles_of(args, cfg, pairs, trace, t0, kv_beats: dict | None = None) -> dict[int, list[int]]:
    """Measured LAD tile cycles per step, per head index (simulated now or from ``--reuse-rtl``);
    with ``kv_beats``, each simulated head's KV beats per step (the tile's port) are put there too."""
    if args.reuse_rtl:
        old = json.loads(args.reuse_rtl.read_text())
        if old.get("config") != cfg.to_dict():
            sys.exit(f"ladmac: error: {args.reuse_rtl} was measured at another LadTileConfig")
        keys = [f"{a}:{b}" for a, b in pairs]
        if kv_beats is not None:
            kv_beats.update({keys.index(k): b for k, b in old.get("rtl_step_kv_beats", {}).items() if k in keys})
        return {keys.index(k): c for k, c in old["rtl_step_cycles"].items() if k in keys}
    steps_per_head = (args.rtl_steps + [0] * len(pairs))[:len(pairs)]
    path = (Path("build") / "results" / "lad_bench_trace.pt").resolve()   # the simulator runs elsewhere
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({n: trace[n][:, :max(steps_per_head + [1])].half() for n in trace}, path)
    measured = {}
    for h, steps in enumerate(steps_per_head):
        if steps <= 0:
            continue
        rep = simulate("lad-tile", cfg, "testbenches.tb.tb_lad_tile", seed=7, name=f"bench{h}",
                       params={"trace": str(path), "head": h, "steps": steps, "gap": 0.0, "stall": 0.0,
                               "latency": [1, 1]})
        if rep["mismatches"]:
            sys.exit(f"ladmac: error: RTL differs from the bit-accurate model on head {pairs[h]}")
        measured[h] = rep["step_cycles"]
        if kv_beats is not None:
            kv_beats[h] = rep["kv_beats"]
        print(f"LAD tile RTL: {steps} steps of head {pairs[h]} bit-exact; {sum(measured[h])} cycles in all "
              f"({time.time() - t0:.0f} s so far)", flush=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--heads", nargs="+", default=None,
                        help="LAYER:QUERY_HEAD pairs (with --set group=G: LAYER:KV_HEAD; default: the KV "
                             "heads of the default query heads)")
    parser.add_argument("--rtl-steps", type=int, nargs="+", default=None,
                        help="steps simulated in RTL, per head (missing = 0; default 512 0 0 512 0 512 0 0, "
                             "none for a group)")
    parser.add_argument("--window", type=int, default=64, help="steps averaged per reported context")
    parser.add_argument("--reuse-rtl", type=Path, default=None,
                        help="take the measured RTL cycles from this earlier --out JSON")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="LadTileConfig override (repeatable)")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if min(args.contexts) < args.window:
        sys.exit(f"ladmac: error: every context must be >= --window ({args.window})")
    try:
        cfg = LadTileConfig().with_overrides(dict(o.split("=", 1) for o in args.overrides))
    except ConfigError as e:
        sys.exit(f"ladmac: error: {e}")
    g = cfg.group
    if args.heads is None:
        args.heads = [f"{a}:{int(b) // g}" for a, b in (p.split(":") for p in DEFAULT_HEADS)]
    if args.rtl_steps is None:
        args.rtl_steps = [512, 0, 0, 512, 0, 512, 0, 0] if g == 1 else []
    if args.reuse_rtl and not args.reuse_rtl.is_file():
        sys.exit(f"ladmac: error: --reuse-rtl {args.reuse_rtl}: no such file")
    from benchmarks.record_lad_trace import record_heads
    t0 = time.time()
    dense_cfg = cfg.dense()
    pairs = tuple(tuple(int(x) for x in s.split(":")) for s in args.heads)   # tiles: (layer, head or KV head)
    heads = tuple((a, b * g + j) for a, b in pairs for j in range(g))        # the query heads recorded
    # float16 as stored for the testbench (testbenches/data), then the tile's s16.8: RTL and model see the same
    cache = Path("build") / "results" / f"lad_vs_dense_trace-{max(args.contexts)}-{'_'.join(f'{a}.{b}' for a, b in heads)}.pt"
    if cache.is_file():   # the recorded heads of an earlier run (the model's forward pass is the slow part)
        trace = torch.load(cache)
    else:
        trace = {n: t.half().float() for n, t in record_heads(max(args.contexts), heads).items()
                 if n in ("q", "k", "v")}
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(trace, cache)
    f = cfg.kv_format
    bytes_per_beat = cfg.lanes * cfg.kv_width // 8
    results = {"config": cfg.to_dict(), "contexts": args.contexts, "heads": [list(p) for p in pairs], "group": g,
               "window": args.window, "rows": []}

    rtl_kv_beats = {}
    rtl_cycles = rtl_cycles_of(args, cfg, pairs, trace, t0, kv_beats=rtl_kv_beats)
    dense_cycles = {}
    for n in sorted(set(args.contexts)):
        d = simulate("dense", dense_cfg, "testbenches.tb.tb_dense", seed=5, name=f"bench{n}",
                     params={"steps": 1, "max_len": n, "lengths": [n], "gap": 0.0, "stall": 0.0, "latency": [1, 1]})
        dense_cycles[n] = d["step_cycles"][0]   # at a group: the group-aware block (its RTL)

    all_stats = golden_stats(cfg, *(f.quantize(trace[n]) for n in ("q", "k", "v")))
    fit = [(st, c) for h, cyc in rtl_cycles.items() for st, c in zip(all_stats[h], cyc) if st["position"] >= FIT_FROM]
    fit_stats, fit_cyc = [s for s, _ in fit], [c for _, c in fit]
    every = torch.ones(len(fit), dtype=torch.bool)
    late = torch.tensor([s["position"] >= EXTRAPOLATE_FROM for s in fit_stats])
    if fit:   # the schedule model against the RTL (none where no simulated step reaches FIT_FROM)
        stored = model_cycles(cfg, fit_stats, *schedule_constants(cfg))
        fixed, per_change, per_position = fit_constants(cfg, fit_stats, fit_cyc)
        results["cycle_model"] = {
            "model": "golden.lad_tile.schedule_cycles", "steps": len(fit), "fit_from_position": FIT_FROM,
            "constants": dict(zip(("fixed", "per_mode_change", "per_position"), schedule_constants(cfg))),
            "rel_error": dict(zip(("max", "mean"), rel_errors(stored, fit_cyc, every))),
            "least_squares_now": {"fixed": fixed, "per_mode_change": per_change, "per_position": per_position},
            "extrapolation": None}
        if late.any() and (~late).any():   # fitted on the early steps, checked on the late ones
            early = fit_constants(cfg, fit_stats, fit_cyc, use=~late)
            results["cycle_model"]["extrapolation"] = {
                "fitted_below_position": EXTRAPOLATE_FROM, "constants": list(early),
                **dict(zip(("max_rel_error", "mean_rel_error"),
                           rel_errors(model_cycles(cfg, fit_stats, *early), fit_cyc, late)))}
    results["rtl_step_cycles"] = {f"{pairs[h][0]}:{pairs[h][1]}": c for h, c in rtl_cycles.items()}
    results["rtl_step_kv_beats"] = {f"{pairs[h][0]}:{pairs[h][1]}": b for h, b in rtl_kv_beats.items()}
    if rtl_kv_beats:   # the tile's KV port against what the model reads (a group's: the union)
        port = sum(sum(b) for b in rtl_kv_beats.values())
        model = sum(st["kv_beats"] for h, b in rtl_kv_beats.items() for st in all_stats[h][:len(b)])
        results["kv_port"] = {"rtl_beats": port, "model_beats": model, "ratio": port / model}
    results["dense_cycles"] = dense_cycles

    # every step's LAD figures: measured cycles where simulated, the model elsewhere
    series = {}
    for h, pair in enumerate(pairs):
        stats, measured, port = all_stats[h], rtl_cycles.get(h, []), rtl_kv_beats.get(h, [])
        modelled = model_cycles(cfg, stats, *schedule_constants(cfg)).tolist()
        series[h] = {   # measured where simulated (cycles, and the port's KV beats), the model elsewhere
            "kv_bytes": [(port[i] if i < len(port) else st["kv_beats"]) * bytes_per_beat for i, st in enumerate(stats)],
            "cycles": [measured[i] if i < len(measured) else modelled[i] for i in range(len(stats))],
            "candidates": [st["candidates"] for st in stats], "active": [st["active"] for st in stats],
            "false_alarms": [st["false_alarms"] for st in stats], "centers": [st["centers"] for st in stats],
            "floor": [floor_cycles(cfg, st) for st in stats], "mode_changes": [st["mode_changes"] for st in stats],
            "measured_steps": len(measured)}
    results["per_step"] = {f"{a}:{b}": series[h] for h, (a, b) in enumerate(pairs)}

    w = args.window
    # the model against the RTL where both exist, as the rows use it: means over w steps
    window_err = []
    for h, cyc in rtl_cycles.items():
        modelled = model_cycles(cfg, all_stats[h], *schedule_constants(cfg))
        for n in range(max(FIT_FROM + w, w), len(cyc) + 1, w):
            rtl = sum(cyc[n - w:n]) / w
            window_err.append(abs(float(modelled[n - w:n].mean()) - rtl) / rtl)
    if results.get("cycle_model"):
        results["cycle_model"]["window_mean_rel_error_max"] = max(window_err, default=float("nan"))
    print(f"Each row: mean over the {w} steps ending at the context (LAD), dense at the context.")
    unit = "group (layer:KV head)" if g > 1 else "head (layer:q)"
    print(f"| {unit} | context | LAD KV bytes/step | dense KV bytes/step | KV ratio | candidates % | "
          "active % | false alarms % | centers | LAD cycles/step | dense cycles/step | cycle ratio | "
          "floor/step | cycles / floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for h, pair in enumerate(pairs):
        s = series[h]
        for n in args.contexts:
            win = range(n - w, n)               # steps at positions n-w .. n-1 (contexts n-w+1 .. n)
            mean = lambda key: sum(s[key][i] for i in win) / w  # noqa: E731
            share = lambda key: 100 * sum(s[key][i] / max(1, i) for i in win) / w  # noqa: E731
            measured = n <= s["measured_steps"]
            dense_bytes = 2 * n * dense_cfg.beats * bytes_per_beat
            row = {"head": list(pair), "context": n, "lad_kv_bytes": mean("kv_bytes"), "dense_kv_bytes": dense_bytes,
                   "candidates_pct": share("candidates"), "active_pct": share("active"),
                   "false_alarm_pct": share("false_alarms"), "centers": s["centers"][n - 1],
                   "lad_cycles": mean("cycles"), "lad_cycles_measured": measured, "dense_cycles": dense_cycles[n],
                   "floor": mean("floor"), "mode_changes": mean("mode_changes")}
            results["rows"].append(row)
            print(f"| {pair[0]}:{pair[1]} | {n} | {row['lad_kv_bytes']:.0f} | {dense_bytes} | "
                  f"{row['lad_kv_bytes'] / dense_bytes:.3f} | {row['candidates_pct']:.1f} | {row['active_pct']:.1f} | "
                  f"{row['false_alarm_pct']:.1f} | {row['centers']} | {row['lad_cycles']:.0f}"
                  f"{'' if measured else ' (model)'} | {dense_cycles[n]} | {row['lad_cycles'] / dense_cycles[n]:.3f} | "
                  f"{row['floor']:.0f} | {row['lad_cycles'] / row['floor']:.2f} |",
                  flush=True)
    tiles = "groups" if g > 1 else "heads"
    print(f"| context | cycle ratio, mean over {tiles} | worst | KV bytes ratio, mean | cycles / floor, worst |")
    print("|---|---|---|---|---|")
    results["summary"] = []
    for n in args.contexts:
        rows = [r for r in results["rows"] if r["context"] == n]
        ratios = [r["lad_cycles"] / r["dense_cycles"] for r in rows]
        worst = max(range(len(rows)), key=lambda i: ratios[i])
        summary = {"context": n, "cycle_ratio_mean": sum(ratios) / len(ratios), "cycle_ratio_max": ratios[worst],
                   "worst_head": rows[worst]["head"],
                   "kv_ratio_mean": sum(r["lad_kv_bytes"] / r["dense_kv_bytes"] for r in rows) / len(rows),
                   "cycles_over_floor_max": max(r["lad_cycles"] / r["floor"] for r in rows)}
        results["summary"].append(summary)
        print(f"| {n} | {summary['cycle_ratio_mean']:.3f} | {summary['cycle_ratio_max']:.3f} "
              f"({rows[worst]['head'][0]}:{rows[worst]['head'][1]}) | {summary['kv_ratio_mean']:.3f} | "
              f"{summary['cycles_over_floor_max']:.2f} |", flush=True)
    kp = results.get("kv_port")
    if kp:
        print(f"KV port, simulated steps: {kp['rtl_beats']} beats read by the RTL, {kp['model_beats']} in the model's "
              f"reads ({'the union over the heads' if g > 1 else 'the head'}): {kp['ratio']:.3f}x", flush=True)
    cm = results.get("cycle_model")
    if cm:
        ex = cm["extrapolation"]
        const = lambda c: ", ".join(f"{k.replace('_', ' ')} {v:.3g}" for k, v in c.items() if v or k != "per_position")
        print(f"cycle model (golden.lad_tile.schedule_cycles: {const(cm['constants'])}) vs {cm['steps']} RTL steps at "
              f"positions >= {FIT_FROM}: relative error max {cm['rel_error']['max']:.4f}, mean {cm['rel_error']['mean']:.4f}; "
              f"least squares on them now: {const(cm['least_squares_now'])}; "
              + (f"fitted below position {EXTRAPOLATE_FROM} only ({', '.join(f'{c:.3g}' for c in ex['constants'])}), "
                 f"on the steps beyond: max {ex['max_rel_error']:.4f}, mean {ex['mean_rel_error']:.4f}; " if ex else
                 f"no extrapolation check (no simulated steps on both sides of position {EXTRAPOLATE_FROM}); ")
              + f"on {w}-step means (as in the table): max {cm['window_mean_rel_error_max']:.4f}")
    else:
        print(f"cycle model: not checked (no simulated step at position >= {FIT_FROM})")
    print(f"wall time {time.time() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results))
        print(f"wrote {args.out}")
    if args.plot:
        plot(results, pairs, series, dense_cfg, bytes_per_beat, w, args.plot)
        print(f"wrote {args.plot}")


def plot(results, pairs, series, dense_cfg, bytes_per_beat, w, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def moving(y):   # trailing mean over w steps
        out, acc = [], 0.0
        for i, x in enumerate(y):
            acc += x - (y[i - w] if i >= w else 0.0)
            out.append(acc / min(i + 1, w))
        return out

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ctx_all = None
    for h, pair in enumerate(pairs):
        s, color = series[h], f"C{h}"
        label = f"L{pair[0]} {'KV' if results['group'] > 1 else 'H'}{pair[1]}"
        ctx = list(range(1, len(s["kv_bytes"]) + 1))
        ctx_all = ctx
        kv, cyc = moving(s["kv_bytes"]), moving(s["cycles"])
        dense_kv = [2 * c * dense_cfg.beats * bytes_per_beat for c in ctx]
        axes[0].plot(ctx, [b / 1024 for b in s["kv_bytes"]], color=color, lw=0.3, alpha=0.3)
        axes[0].plot(ctx, [b / 1024 for b in kv], color=color, lw=1.5, label=f"LAD {label}")
        m = s["measured_steps"]
        if m:
            axes[1].plot(ctx[:m], s["cycles"][:m], color=color, lw=0.4, alpha=0.5)
            axes[1].plot(ctx[:m], cyc[:m], color=color, lw=1.8, label=f"LAD {label} (RTL)")
        axes[1].plot(ctx[m:], cyc[m:], color=color, lw=1.2, ls=":", label=f"LAD {label} (model)")
        axes[2].plot(ctx, [a / b for a, b in zip(kv, dense_kv)], color=color, lw=1.5, label=f"{label} KV bytes")
    dc = results["dense_cycles"]
    xs = sorted(dc)
    axes[0].plot(ctx_all, [2 * c * dense_cfg.beats * bytes_per_beat / 1024 for c in ctx_all], "k--", label="dense")
    axes[1].plot(xs, [dc[x] for x in xs], "ko--", ms=3,
                 label="group-aware dense (RTL + the further queries' beats)" if results["group"] > 1 else "dense (RTL)")
    for h, pair in enumerate(pairs):
        rows = [r for r in results["rows"] if r["head"] == list(pair)]
        axes[2].plot([r["context"] for r in rows], [r["lad_cycles"] / r["dense_cycles"] for r in rows], "s--",
                     color=f"C{h}", mfc="white", ms=4, label="cycles (squares)" if h == 0 else None)
    axes[2].axhline(1.0, color="k", lw=0.8)
    axes[0].set_ylabel("KV KiB read per step")
    axes[1].set_ylabel("cycles per step")
    axes[2].set_ylabel("LAD / dense")
    for ax in axes:
        ax.set_xlabel("context (keys incl. the new one)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    what = (f"LAD tile per KV group of {results['group']} vs the group-aware dense baseline"
            if results["group"] > 1 else "LAD tile vs dense PWL baseline")
    fig.suptitle(f"{what}, SmolLM2-135M WikiText-2 (d=64, 8 lanes); "
                 f"thick: {w}-step mean, thin: per step", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
