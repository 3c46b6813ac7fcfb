"""Cycles per decode step of the MAC decode engine RTL (hdl/mac/decode.py), measured under
Verilator, next to the engine's own schedule (golden.mac_decode.engine_step_cycles: its FSM's
states, exact here) and the planned schedule golden.mac_decode.head_step_cycles on the same steps.

    .venv/bin/python -m benchmarks.mac_decode_rtl_cycles [--quick] [--long STEPS] [--out RUN.json]

No query gaps, no back-pressure, KV memory and entry store answering after 1 cycle (one beat per
cycle). A step's RTL cycles run from its first query beat to its statistics beat (the engine's
``cycles`` field). Runs: ``tiny`` (M 8, d 8, L 4, S 4; two heads of the random sequence of
testbenches/tb/mac_decode_steps.py, 30 steps) and, without ``--quick``, 80 real SmolLM2 steps (layer 12,
head 0; M 32, S 8, d 64, L 8). ``--long STEPS``: also STEPS real steps of the same head at the
engine's defaults (M 512, S 256, 4 sinks, d 64, L 8) from position 4096 (4097 keys and more), the
engine taking over there with empty rings (the prompt's keys and values only in the KV memory);
its trace of 4096 + STEPS tokens is recorded into build/results on first use
(benchmarks/record_mac_trace.py, about a minute). Per kind of step: before min_context (idle),
hit, miss, fallback.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from golden.mac_decode import PRESETS, MacDecodeConfig, dense_head_cycles
from testbenches.runner import simulate

TRACE = Path(__file__).resolve().parent.parent / "testbenches" / "data" / "smollm2_mac_trace.pt"
NO_STALLS = {"gap": 0.0, "stall": 0.0, "latency": [1, 1]}
LONG_START = 4096   # the long run's first position


def long_trace(steps: int) -> dict:
    """The long run's trace files (layer 12 of SmolLM2 over LONG_START + steps tokens), recorded once."""
    from benchmarks.record_mac_trace import record
    import torch
    base = Path("build") / "results" / f"mac_trace_{LONG_START + steps}"
    paths = {"trace": str(base) + ".pt", "head_trace": str(base) + "_head.pt"}
    if not all(Path(p).is_file() for p in paths.values()):
        print(f"recording SmolLM2 layer 12 over {LONG_START + steps} WikiText-2 tokens ...", flush=True)
        trace, head = record(LONG_START + steps, 12)
        base.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: trace[k] for k in ("q_pre", "layer", "tokens", "command")}, paths["trace"])   # no merge cases
        torch.save(head, paths["head_trace"])
    return {name: str(Path(p).resolve()) for name, p in paths.items()}   # the simulator runs elsewhere


def runs(quick: bool, long: int):
    yield "tiny random", PRESETS["tiny"], {"steps": 30, "heads_used": 2, "seq_seed": 2025}
    if not quick:
        cfg = MacDecodeConfig(window=32, band=8, min_context=40, sinks=0, heads=1, lanes=8, max_positions=128)
        yield "SmolLM2 L12 H0", cfg, {"trace": str(TRACE), "steps": 80}
    if long:
        yield f"SmolLM2 from {LONG_START}", MacDecodeConfig(), {**long_trace(long), "start": LONG_START, "steps": long}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the tiny run")
    ap.add_argument("--long", type=int, default=0, metavar="STEPS",
                    help="also STEPS real steps at the defaults from position 4096")
    ap.add_argument("--out", help="write the per-step cycles as JSON")
    args = ap.parse_args(argv)
    if args.long < 0:
        ap.error("--long must be >= 0")
    results = []
    print(f"{'run':16} {'kind':9} {'steps':>5} {'keys':>6} {'RTL':>7} {'engine':>7} {'planned':>7} {'RTL/planned':>11}")
    for name, cfg, params in runs(args.quick, args.long):
        t0 = time.time()
        r = simulate("mac-decode", cfg, seed=1, name="cycles", params={**params, **NO_STALLS})
        assert r["mismatches"] == 0, r["mismatch_list"][:3]
        off = sum(a != b for a, b in zip(r["rtl_cycles"], r["engine_cycles"]))
        if off:
            print(f"{name}: {off} steps off the engine schedule (golden.mac_decode.engine_step_cycles)")
        rows = list(zip(r["kinds"], r["kv_keys"], r["rtl_cycles"], r["engine_cycles"], r["model_cycles"]))
        for kind in ("idle", "hit", "miss", "fallback", "all"):
            sel = [row for row in rows if kind == "all" or row[0] == kind]
            if not sel:
                continue
            keys, rtl, engine, model = (statistics.mean(row[i] for row in sel) for i in (1, 2, 3, 4))
            print(f"{name:16} {kind:9} {len(sel):5d} {keys:6.1f} {rtl:7.1f} {engine:7.1f} {model:7.1f} {rtl / model:11.2f}")
        if params.get("start"):   # against the dense baseline at the same KV bandwidth, the same steps
            start = params["start"]
            dense = statistics.mean(dense_head_cycles(cfg, start + 1 + i) for i in range(len(rows)))
            print(f"{name:16} RTL cycles per step {statistics.mean(r['rtl_cycles']):.0f} vs dense "
                  f"{dense:.0f} ({statistics.mean(r['rtl_cycles']) / dense:.3f}x), keys {start + 1}.."
                  f"{start + len(rows)}; {time.time() - t0:.0f} s")
        results.append({"run": name, "config": cfg.to_dict(), "kinds": r["kinds"], "kv_keys": r["kv_keys"],
                        "rtl_cycles": r["rtl_cycles"], "engine_cycles": r["engine_cycles"],
                        "model_cycles": r["model_cycles"], "off_engine_schedule": off,
                        "sim_s": round(time.time() - t0, 1)})
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
