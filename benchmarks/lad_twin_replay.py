"""The LAD tile's bit-accurate model vs its float twin on real SmolLM2 heads, step by step.

    .venv/bin/python -m benchmarks.lad_twin_replay [--tokens 2048] [--heads 7:7 11:5 18:7 12:4 3:0 25:8]
        [--set NAME=VALUE ...] [--window 256] [--out build/results/lad_twin_replay.json]

Records q, k, v of the (layer, query head) pairs (benchmarks/record_lad_trace.py), quantizes
them to the tile's kv format and steps ``golden.lad_batch.LadTileBatch`` (bit-exact with the
RTL) and the float twin ``golden.lad_ref.LadHead`` (``LadTileConfig.reference()``, fed the same
quantized inputs) side by side. Per head and window of steps it prints the worst and mean
``|o - o_exact| / max|v|`` of both against exact softmax attention, and the worst
``|o_bits - o_float| / max|v|``: where the integer datapath departs from the algorithm
(docs/lad-tile.md, "Numerics"). JSON rows are written as the run goes.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.record_lad_trace import record_heads
from golden.cli import add_overrides, configure_or_exit
from golden.lad_batch import LadTileBatch
from golden.lad_ref import LadHead, full_attention
from golden.lad_tile import LadTileConfig

DEFAULT_HEADS = ("7:7", "11:5", "18:7", "12:4", "3:0", "25:8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--heads", nargs="+", default=list(DEFAULT_HEADS), help="LAYER:QUERY_HEAD pairs")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("build/results/lad_twin_replay.json"))
    add_overrides(parser, "a LadTileConfig parameter")
    args = parser.parse_args()
    cfg = configure_or_exit("lad_twin_replay", LadTileConfig(), args.set)
    pairs = tuple(tuple(int(x) for x in s.split(":")) for s in args.heads)
    t = record_heads(args.tokens, pairs)
    f, H, T = cfg.kv_format, len(pairs), args.tokens
    q, k, v = (f.quantize(t[n].float()) for n in ("q", "k", "v"))
    qf, kf, vf = (f.to_float(x).double() for x in (q, k, v))
    # heads of different layers share no keys: each its own tile (group 1; per head, a group tile's
    # numerics are the one-head tile's)
    bits, twin = LadTileBatch(replace(cfg, group=1), H), LadHead(cfg.reference(), heads=H)
    vmax = vf.abs().amax((1, 2))
    scale = 1 / math.sqrt(cfg.head_dim)
    err = torch.zeros(3, H, T)     # tile vs exact, twin vs exact, tile vs twin
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(T):
        o, _ = bits.step(q[:, i], k[:, i], v[:, i])
        of, _ = twin.step(qf[:, i], kf[:, i], vf[:, i])
        ob = f.to_float(o).double()
        ex = torch.stack([full_attention(qf[h, i], kf[h, :i + 1], vf[h, :i + 1], scale) for h in range(H)])
        err[0, :, i] = (ob - ex).abs().amax(1) / vmax
        err[1, :, i] = (of - ex).abs().amax(1) / vmax
        err[2, :, i] = (ob - of).abs().amax(1) / vmax
        if (i + 1) % args.window == 0 or i == T - 1:
            w = slice(max(0, i + 1 - args.window), i + 1)
            for h, pair in enumerate(pairs):
                e = err[:, h, w]
                row = {"layer": pair[0], "head": pair[1], "steps": [w.start, i], "centers": int(bits.n_centers[h]),
                       "tile_exact_mean": float(e[0].mean()), "tile_exact_max": float(e[0].max()),
                       "twin_exact_mean": float(e[1].mean()), "twin_exact_max": float(e[1].max()),
                       "tile_twin_max": float(e[2].max())}
                rows.append(row)
                print(f"steps {w.start}-{i} layer {pair[0]} head {pair[1]}: vs exact tile mean {row['tile_exact_mean']:.4f} "
                      f"max {row['tile_exact_max']:.3f}, twin mean {row['twin_exact_mean']:.4f} max "
                      f"{row['twin_exact_max']:.3f}; tile vs twin max {row['tile_twin_max']:.3f}", flush=True)
            args.out.write_text(json.dumps({"config": json.loads(cfg.to_json()), "tokens": T, "rows": rows}, indent=1))
    print(f"worst |o_bits - o_float| / max|v| over {H} heads x {T} steps: {float(err[2].max()):.4f}; "
          f"mean {float(err[2].mean()):.5f}")


if __name__ == "__main__":
    main()
