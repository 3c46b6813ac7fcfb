"""The cycle figures the system model (synth/system/engines.py) uses per head step, against the RTL
under Verilator on real SmolLM2 decode steps, for the three attention engines.

    .venv/bin/python -m benchmarks.system_cycles [--quick] [--lad-steps N] [--out RUN.json]

(6 min on the 2-core machine, builds cached; ``--quick`` 1.5 min.)

No stream gaps, no back-pressure, a one-cycle KV memory (as the system model assumes: the engine's
own cost). Per engine, the model is the function the system model takes its cycles from:

- dense tile: ``golden.dense.dense_step_cycles`` (hdl/lad/dense.py's RTL, testbenches/tb/tb_dense.py
  with ``trace``: layer 12 head 0 of testbenches/data/smollm2_head_trace.pt, steps at contexts spread
  evenly over 9..640; the bench itself fails on any step off the model);
- LAD tile: ``golden.lad_tile.schedule_cycles`` with its stored constants (the activity records'
  ``tile_cycles``), on the first ``--lad-steps`` steps of each head of
  testbenches/data/smollm2_lad_trace.pt (3:0, 12:4, 25:8), every step bit-exact; steps at positions
  below ``FIT_FROM`` (16) are left out, as in benchmarks/lad_vs_dense.py, whose helpers run it;
- MAC decode engine: ``golden.mac_decode.engine_step_cycles`` (the records' ``rtl_cycles``, computed
  batched by ``engine_cycles_batch``, equal to it: testbenches/test_mac_decode.py), on the SmolLM2 run
  of benchmarks/mac_decode_rtl_cycles.py (layer 12 head 0; that bench's M 32, S 8, min_context 40, not
  the system's M 512, S 256), idle steps before min_context included.

Per engine: steps, mean RTL and model cycles per step, mean and max per-step ``|model - RTL| / RTL``
and the error of the mean (``(mean model - mean RTL) / mean RTL``: what a layer's sum carries).
``--quick``: 4 dense steps, 64 LAD steps of head 12:4, 50 MAC steps. ``--out``: per-step cycles.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.lad_vs_dense import FIT_FROM, golden_stats, model_cycles, rtl_cycles_of
from benchmarks.mac_decode_rtl_cycles import NO_STALLS
from benchmarks.mac_decode_rtl_cycles import runs as mac_runs
from golden.dense import DenseConfig, dense_step_cycles
from golden.lad_tile import LadTileConfig, schedule_constants
from synth.system.engines import load_record
from testbenches.runner import simulate

DATA = Path(__file__).resolve().parent.parent / "testbenches" / "data"


def dense(quick: bool) -> dict:
    cfg = DenseConfig()   # = LadTileConfig().dense(), the system's at d 64 up to 4096 positions
    r = simulate("dense", cfg, "testbenches.tb.tb_dense", seed=5, name="system",
                 params={"trace": str(DATA / "smollm2_head_trace.pt"), "steps": 4 if quick else 32,
                         "max_len": 640, **NO_STALLS})
    return {"what": f"L12 H0, contexts {min(r['lengths'])}..{max(r['lengths'])}", "context": r["lengths"],
            "rtl": r["step_cycles"], "model": [dense_step_cycles(cfg, n) for n in r["lengths"]]}


def lad(quick: bool, steps: int, t0: float) -> dict:
    cfg = LadTileConfig(**load_record("lad-tile", 4096, one_head=True)["config"])   # the one-head records' config
    data = torch.load(DATA / "smollm2_lad_trace.pt")
    pairs = [tuple(p) for p in data["pairs"]]
    trace = {n: data[n].float() for n in ("q", "k", "v")}
    per_head = [0 if quick and pair != (12, 4) else steps for pair in pairs]
    measured = rtl_cycles_of(SimpleNamespace(reuse_rtl=None, rtl_steps=per_head), cfg, pairs, trace, t0)
    stats = golden_stats(cfg, *(cfg.kv_format.quantize(trace[n][:, :steps]) for n in ("q", "k", "v")))
    out = {"what": f"heads {' '.join(f'{pairs[h][0]}:{pairs[h][1]}' for h in measured)}, positions "
                   f"{FIT_FROM}..{steps - 1}", "head": [], "position": [], "mode_changes": [], "rtl": [], "model": []}
    for h, cycles in measured.items():
        model = model_cycles(cfg, stats[h], *schedule_constants(cfg)).tolist()
        for st, rtl, mod in zip(stats[h], cycles, model):
            if st["position"] >= FIT_FROM:
                for key, val in (("head", f"{pairs[h][0]}:{pairs[h][1]}"), ("position", st["position"]),
                                 ("mode_changes", st["mode_changes"]), ("rtl", rtl), ("model", mod)):
                    out[key].append(val)
    return out


def mac(quick: bool) -> dict:
    _, cfg, params = list(mac_runs(False))[-1]   # the SmolLM2 run of benchmarks/mac_decode_rtl_cycles.py
    if quick:
        params = {**params, "steps": 50}
    r = simulate("mac-decode", cfg, seed=1, name="system", params={**params, **NO_STALLS})
    assert r["mismatches"] == 0, r["mismatch_list"][:3]
    kinds = {k: r["kinds"].count(k) for k in ("idle", "hit", "miss", "fallback")}
    return {"what": "L12 H0, M 32 S 8; " + " ".join(f"{n} {k}" for k, n in kinds.items() if n), "kind": r["kinds"],
            "kv_keys": r["kv_keys"], "rtl": r["rtl_cycles"], "model": r["engine_cycles"]}


def summary(res: dict) -> dict:
    rtl, model = res["rtl"], res["model"]
    err = [abs(m - c) / c for c, m in zip(rtl, model)]
    mean_rtl, mean_model = statistics.mean(rtl), statistics.mean(model)
    return {"steps": len(rtl), "rtl_mean": mean_rtl, "model_mean": mean_model, "err_mean_pct": 100 * statistics.mean(err),
            "err_max_pct": 100 * max(err), "err_of_means_pct": 100 * (mean_model - mean_rtl) / mean_rtl}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer steps (module docstring)")
    ap.add_argument("--lad-steps", type=int, default=None, help="LAD steps per head (default 512, --quick 64)")
    ap.add_argument("--out", type=Path, help="write the per-step cycles as JSON")
    args = ap.parse_args(argv)
    t0 = time.time()
    lad_steps = args.lad_steps or (64 if args.quick else 512)
    results = {}
    for name, run in (("dense", lambda: dense(args.quick)), ("lad-tile", lambda: lad(args.quick, lad_steps, t0)),
                      ("mac-decode", lambda: mac(args.quick))):
        t = time.time()
        results[name] = run()
        results[name]["sim_s"] = round(time.time() - t, 1)
        results[name]["summary"] = summary(results[name])
        print(f"{name}: {results[name]['summary']['steps']} steps in {results[name]['sim_s']:.0f} s", flush=True)
    print("| engine | steps | RTL cycles/step | model cycles/step | mean error % | max error % | error of the mean % | steps run |")
    print("|---|---|---|---|---|---|---|---|")
    for name, res in results.items():
        s = res["summary"]
        print(f"| {name} | {s['steps']} | {s['rtl_mean']:.1f} | {s['model_mean']:.1f} | {s['err_mean_pct']:.2f} | "
              f"{s['err_max_pct']:.2f} | {s['err_of_means_pct']:+.2f} | {res['what']} |")
    print(f"wall time {time.time() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
