"""Cycles and KV traffic per decode step of the dense PWL attention baseline, under Verilator.

    .venv/bin/python -m benchmarks.dense_cycles [--contexts 512 1024 2048 4096] [--group G]

One step per context length, random q/k/v (cycles do not depend on the data), no input
gaps, no back-pressure and a one-cycle KV memory: the block's own cost. KV bytes are
the beats requested times lanes times kv_width/8; ``model``: golden.dense.dense_step_cycles, the
schedule's model (equal, or the bench fails). This is the reference the LAD tile is to be compared
with (docs/lad-tile.md); with ``--group G`` the group-aware block (G query heads of one KV head on
one KV stream), the baseline of a LAD tile per KV group.
"""
from __future__ import annotations

import argparse

from golden.dense import DenseConfig, dense_step_cycles
from testbenches.runner import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--group", type=int, default=1, help="query heads on the one KV stream (default 1)")
    args = parser.parse_args()
    cfg = DenseConfig(group=args.group)
    print("| context | cycles/step | model | KV beats | KV bytes | cycles per KV beat |")
    print("|---|---|---|---|---|---|")
    for n in args.contexts:
        rep = simulate("dense", cfg, "testbenches.tb.tb_dense", seed=5, name=f"bench{n}-g{cfg.group}",
                       params={"steps": 1, "max_len": n, "lengths": [n], "gap": 0.0, "stall": 0.0,
                               "latency": [1, 1]})
        beats = rep["kv_requests"]
        cycles = rep["step_cycles"][0]
        print(f"| {n} | {cycles} | {dense_step_cycles(cfg, n)} | {beats} | {beats * cfg.lanes * cfg.kv_width // 8} | {cycles / beats:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
