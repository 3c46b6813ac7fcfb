"""Cycles per decode step of the MAC decode engine vs the dense baseline at equal KV bandwidth, from
the per-step stats of an ``ladmac eval mac`` run (``--out`` JSON), with the schedule's model
``golden.mac_decode.head_step_cycles`` / ``dense_head_cycles`` (docs/mac-unit.md, "Decode engine").

- A ``--hardware`` run's ``steps_hardware`` carry the model's cycles per head (each head's own KV
  reads): reported as they are.
- A float run's ``steps`` carry each query head's own KV reads (``head_kv_read``: the keys the engine,
  which runs one head at a time, reads for it), and the reads per KV group (the GQA rule: a group
  reads the union of its heads' ranges unless all hit). Cycles charge each head its own reads; runs
  from before ``head_kv_read`` was recorded charge every head its group's reads, an upper bound. A
  fallback is charged the whole prefix. KV bytes stay per group (a group's heads share one fetch).

Bytes: KV memory = keys + values read (16-bit elements), entry store = entry read on a hit, entry
write, ring scan when engaged and ring write, per query head.

    python -m benchmarks.mac_decode_cycles build/results/mac_8192.json --last 512 --plot docs/img
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from golden.llm.plots import pyplot, save
from golden.mac_decode import (MATCH_OVERHEAD, MERGE_CYCLES, NORM_CYCLES, PASS_LATENCY, MacDecodeConfig,
                               dense_head_cycles)

LAYERS, HQ, HKV = 30, 9, 3   # SmolLM2-135M


def float_step(cfg: MacDecodeConfig, st: dict) -> dict:
    """The engine's cycles of one token step (all layers): each head its own reads where the run
    recorded them, else its group's (an upper bound)."""
    B, g = cfg.beats, HQ // HKV
    L = st["context"]
    layers = st["layer_steps"]
    engaged = st.get("hits", 0) + st.get("misses", 0) > 0
    filled = min(L - 1, cfg.window)
    per_head = ((filled * B + 2 * B + MATCH_OVERHEAD if engaged else B) + 2 * PASS_LATENCY + B
                + 2 * MERGE_CYCLES + 2 * (NORM_CYCLES + B))
    reads = st["head_kv_read"] if "head_kv_read" in st else g * st["kv_read"]
    cycles = (2 * B * reads + st["heads"] * per_head + st["hits"] * B
              + st["fallbacks"] * max(0, L - cfg.band) * B)
    dense = st["heads"] * dense_head_cycles(cfg, L)
    vec = cfg.head_dim * cfg.kv_width / 8
    entry = cfg.entry_bits / 8
    ring = cfg.head_dim * cfg.q_width / 8
    es = st["heads"] * (entry + ring) + st["hits"] * entry + (st["heads"] * filled * ring if engaged else 0)
    return {"context": L, "cycles": cycles, "dense": dense, "kv_bytes": 2 * vec * st["kv_read"],
            "dense_kv_bytes": 2 * vec * HKV * L * layers, "entry_bytes": es}


def hardware_step(st: dict) -> dict:
    return {"context": st["context"], "cycles": st["engine_cycles"], "dense": st["dense_cycles"],
            "kv_bytes": st["kv_bytes"], "dense_kv_bytes": st["dense_kv_bytes"], "entry_bytes": st["entry_bytes"]}


def summarize(rows: list[dict]) -> dict:
    tot = {k: sum(r[k] for r in rows) for k in ("cycles", "dense", "kv_bytes", "dense_kv_bytes", "entry_bytes")}
    return {"steps": len(rows), "contexts": [rows[0]["context"], rows[-1]["context"]],
            "cycles_per_step": tot["cycles"] / len(rows) / LAYERS, "dense_cycles_per_step": tot["dense"] / len(rows) / LAYERS,
            "cycles_vs_dense": tot["cycles"] / tot["dense"],
            "kv_bytes_vs_dense": tot["kv_bytes"] / tot["dense_kv_bytes"],
            "bytes_vs_dense": (tot["kv_bytes"] + tot["entry_bytes"]) / tot["dense_kv_bytes"],
            "entry_bytes_per_step": tot["entry_bytes"] / len(rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="+", help="ladmac eval mac --out JSON files")
    p.add_argument("--last", type=int, default=512, help="steps at the end of each run to summarise")
    p.add_argument("--lanes", type=int, default=16, help="engine lanes (the dense baseline gets the same)")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    out = {}
    for path in args.results:
        r = json.loads(path.read_text())
        cfg = MacDecodeConfig(lanes=args.lanes, **{k: r["config"][k] for k in ("window", "band", "min_context", "sinks")})
        for key, conv in (("steps", lambda s: float_step(cfg, s)), ("steps_hardware", hardware_step)):
            if r.get(key) and (key == "steps" or "engine_cycles" in r[key][0]):
                rows = [conv(s) for s in r[key]][-args.last:]
                per_head = "head_kv_read" in r[key][0]
                name = f"{path.stem}:{'bit-accurate' if key == 'steps_hardware' else 'float' if per_head else 'float (upper bound)'}"
                out[name] = {"summary": summarize(rows), "rows": rows}
                s = out[name]["summary"]
                print(f"{name}: {s['steps']} steps, contexts {s['contexts'][0]}..{s['contexts'][1]}: "
                      f"{s['cycles_per_step']:.0f} cycles per layer-step vs dense {s['dense_cycles_per_step']:.0f} "
                      f"= {s['cycles_vs_dense']:.3f}x; KV bytes {s['kv_bytes_vs_dense']:.3f}x, "
                      f"KV + entry store {s['bytes_vs_dense']:.3f}x of dense")
    if args.plot and out:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for name, v in out.items():
            ax.plot([r["context"] for r in v["rows"]], [r["cycles"] / r["dense"] for r in v["rows"]], lw=0.8,
                    label=f"{name} (mean {v['summary']['cycles_vs_dense']:.3f}x)")
        ax.axhline(0.35, color="red", lw=0.6, ls="--", label="target 0.35x")
        ax.set_xlabel("context (keys)")
        ax.set_ylabel("cycles / dense cycles per step")
        ax.legend(fontsize=7)
        print(f"wrote {save(fig, args.plot / 'decode_mac_cycles.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
