"""Cycles per match and per merge/removal of the MAC unit, measured under Verilator.

    .venv/bin/python -m benchmarks.mac_cycles [--quick]

Match: one head, random queries with no input gaps and no back-pressure; the window
is filled first, then the cycles between consecutive results are the cost of one
match over a full window, compared with the bound M*d/L (one VPU beat per cycle).
Merge: back-to-back transactions; cycles between the first output beats of
consecutive transactions, for merges (⊕) and removals (⊖).
"""
from __future__ import annotations

import argparse
import statistics
import time

from golden.mac_unit import MacUnitConfig
from testbenches.runner import simulate

FULL = [(64, 64, 8), (128, 64, 8), (256, 64, 8), (128, 64, 16), (256, 64, 16), (512, 64, 16), (256, 32, 8)]
QUICK = [(32, 64, 8), (64, 64, 16), (64, 32, 8)]


def match_cycles(window: int, d: int, lanes: int) -> dict:
    cfg = MacUnitConfig(window=window, head_dim=d, lanes=lanes, heads=1)
    extra = 8
    t0 = time.time()
    rep = simulate("mac-match", cfg, "testbenches.tb.tb_mac_match", seed=1, name=f"bench{window}",
                   params={"vectors": window + extra, "gap": 0.0, "stall": 0.0, "heads_used": 1})
    stamps = rep["result_cycles"][window:]
    per_match = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    bound = window * d // lanes
    return {"M": window, "d": d, "L": lanes, "cycles_per_match": per_match, "bound_MdL": bound,
            "overhead": per_match - bound, "ratio": per_match / bound, "sim_s": time.time() - t0}


def merge_cycles(d: int, lanes: int, op_name: str) -> dict:
    cfg = MacUnitConfig(head_dim=d, lanes=lanes)
    rep = simulate("mac-merge", cfg, "testbenches.tb.tb_mac_merge", seed=3, name=f"bench-{op_name}",
                   params={"vectors": 60, "gap": 0.0, "stall": 0.0, "only_op": op_name})
    beats = cfg.beats
    firsts = rep["output_cycles"][::beats]
    return {"d": d, "L": lanes, "op": op_name, "beats": beats,
            "cycles_per_transaction": statistics.median(b - a for a, b in zip(firsts, firsts[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small windows only (about a minute)")
    args = parser.parse_args()
    print("| M | d | L | cycles/match | bound M*d/L | overhead | ratio |")
    print("|---|---|---|---|---|---|---|")
    for w, d, l in (QUICK if args.quick else FULL):
        r = match_cycles(w, d, l)
        print(f"| {r['M']} | {r['d']} | {r['L']} | {r['cycles_per_match']:.0f} | {r['bound_MdL']} | "
              f"{r['overhead']:.0f} | {r['ratio']:.3f} |", flush=True)
    print()
    print("| op | d | L | beats | cycles/transaction |")
    print("|---|---|---|---|---|")
    for d, l in ((64, 8), (64, 16)):
        for op in ("merge", "downdate"):
            r = merge_cycles(d, l, op)
            print(f"| {r['op']} | {r['d']} | {r['L']} | {r['beats']} | {r['cycles_per_transaction']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
