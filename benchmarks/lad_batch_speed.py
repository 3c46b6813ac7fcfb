"""Speed of the batched bit-accurate LAD tile model (golden.lad_batch.LadTileBatch) against one
golden.lad_tile.LadTileModel per head, on the same steps (H = 9 query heads of one SmolLM2
layer, d = 64, default tile config), one CPU thread.

    .venv/bin/python -m benchmarks.lad_batch_speed [--quick] [--contexts 512 1024 2048]
        [--source smollm2|random] [--layer 12] [--window 32] [--max-positions P]

Both models run the same sequence from position 0 to the largest context; each step is timed
(CPU time of this process, which other load on the machine does not inflate, and wall time);
the table gives the mean ms/step over the ``window`` steps ending at each context, the speedup,
and whether the outputs and statistics were identical on every step. The projection is the
time of ``ladmac eval lad --hardware --tokens 2048`` spent in the tile models: 30 layers, one
step per layer and token, per-step time interpolated linearly in the position from the
measured windows (the eval also runs the float model; not counted). ``--max-positions P`` (with
``max_centers = P``) times the exact pass past the table at contexts above ``P``.

``--source smollm2`` records post-RoPE q and the KV head's k, v of all 9 query heads of
``--layer`` over WikiText-2 (benchmarks/record_lad_trace.py; needs the local SmolLM2 files),
falling back to ``random`` (keys along a few directions, drifting queries) if that fails.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from golden.lad_batch import LadTileBatch
from golden.lad_tile import PRESETS, LadTileModel

LAYERS = 30
EVAL_TOKENS = 2048


def sequences(source: str, layer: int, heads: int, steps: int, cfg):
    """Raw q, k, v (heads, steps, d) and a description."""
    if source == "smollm2":
        try:
            from benchmarks.record_lad_trace import record_heads
            t = record_heads(steps, tuple((layer, h) for h in range(heads)))
            f = cfg.kv_format
            return tuple(f.quantize(t[name][:, :steps].float()) for name in ("q", "k", "v")), \
                f"SmolLM2-135M layer {layer}, query heads 0..{heads - 1}, WikiText-2"
        except Exception as exc:      # no local model: synthetic heads instead
            print(f"(SmolLM2 unavailable: {exc}; using random drift sequences)")
    gen = torch.Generator().manual_seed(1000)
    d, f = cfg.head_dim, cfg.kv_format
    qs, ks, vs = [], [], []
    for _ in range(heads):            # keys along a few directions, slowly drifting queries
        base = torch.randn(6, d, generator=gen)
        ks.append(base[torch.randint(0, 6, (steps,), generator=gen)] * torch.randn(steps, 1, generator=gen)
                  + 0.02 * torch.randn(steps, d, generator=gen))
        qs.append(1.5 * torch.randn(d, generator=gen) + torch.cumsum(torch.randn(steps, d, generator=gen) * 0.15, 0))
        vs.append(torch.randn(steps, d, generator=gen) * 2.0)
    return tuple(f.quantize(torch.stack(x)) for x in (qs, ks, vs)), "random drift sequences (seed 1000)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 128 256 512, window 16")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 1536, 2048])
    parser.add_argument("--window", type=int, default=32, help="steps timed ending at each context")
    parser.add_argument("--source", choices=("smollm2", "random"), default="smollm2")
    parser.add_argument("--layer", type=int, default=12)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--max-positions", type=int, default=None,
                        help="the tile's table size (and max_centers): contexts above it time the exact pass")
    args = parser.parse_args()
    if args.quick:
        args.contexts, args.window = [128, 256, 512], 16
    torch.set_num_threads(1)
    cfg = PRESETS["default"]
    if args.max_positions:
        cfg = replace(cfg, max_positions=args.max_positions, max_centers=args.max_positions)
    H, steps = args.heads, max(args.contexts)
    (q, k, v), what = sequences(args.source, args.layer, H, steps, cfg)
    table = f"max_positions {args.max_positions}" if args.max_positions else "default LAD tile config"
    print(f"{what}; H = {H}, d = {cfg.head_dim}, {table}, {steps} steps, 1 thread")

    batch = LadTileBatch(cfg, H)
    tiles = [LadTileModel(cfg) for _ in range(H)]
    cpu = torch.zeros(2, steps, dtype=torch.float64)     # [batch, per-head models] seconds per step
    wall = torch.zeros(2, steps, dtype=torch.float64)
    mismatches = 0
    for i in range(steps):
        c0, w0 = time.process_time(), time.perf_counter()
        o, st = batch.step(q[:, i], k[:, i], v[:, i])
        c1, w1 = time.process_time(), time.perf_counter()
        ref = [tile.step(q[h, i], k[h, i], v[h, i]) for h, tile in enumerate(tiles)]
        c2, w2 = time.process_time(), time.perf_counter()
        cpu[:, i] = torch.tensor([c1 - c0, c2 - c1], dtype=torch.float64)
        wall[:, i] = torch.tensor([w1 - w0, w2 - w1], dtype=torch.float64)
        for h, (oh, sh) in enumerate(ref):
            if not torch.equal(oh, o[h]) or any(int(st[key][h]) != val for key, val in sh.items()):
                mismatches += 1
    print(f"bit-exact: {'yes' if mismatches == 0 else f'NO ({mismatches} head-steps differ)'}\n")
    print(f"{'context':>8} {'batch ms/step':>14} {'per-head ms/step':>17} {'speedup':>8}   "
          f"{'(wall: batch':>12} {'per-head':>9} {'speedup)':>9}")
    points = []
    for L in args.contexts:
        lo = max(0, L - args.window)
        cb, cr = (float(cpu[j, lo:L].mean()) * 1e3 for j in range(2))
        wb, wr = (float(wall[j, lo:L].mean()) * 1e3 for j in range(2))
        points.append((L - (L - lo) / 2, cb, cr))
        print(f"{L:>8} {cb:>14.2f} {cr:>17.2f} {cr / cb:>7.1f}x   {wb:>12.2f} {wr:>9.2f} {wr / wb:>8.1f}x")

    def projected(j: int) -> float:
        """Seconds for LAYERS x EVAL_TOKENS steps, per-step time linear in the position
        between measured points (held constant beyond them)."""
        xs = torch.tensor([p[0] for p in points], dtype=torch.float64)
        ys = torch.tensor([p[1 + j] for p in points], dtype=torch.float64) / 1e3
        pos = torch.arange(EVAL_TOKENS, dtype=torch.float64)
        idx = torch.searchsorted(xs, pos).clamp(1, len(points) - 1) if len(points) > 1 else None
        if idx is None:
            return float(ys[0]) * EVAL_TOKENS * LAYERS
        x0, x1, y0, y1 = xs[idx - 1], xs[idx], ys[idx - 1], ys[idx]
        inner = y0 + (y1 - y0) * (pos - x0) / (x1 - x0)
        per = torch.where(pos <= xs[0], ys[0], torch.where(pos >= xs[-1], ys[-1], inner))
        return float(per.sum()) * LAYERS

    pb, pr = projected(0), projected(1)
    print(f"\nprojected tile-model time of `ladmac eval lad --hardware --tokens {EVAL_TOKENS}` ({LAYERS} layers x "
          f"{H} heads, CPU time): batched {pb / 60:.1f} min, per-head models {pr / 60:.1f} min ({pr / pb:.1f}x)"
          + ("" if max(args.contexts) >= EVAL_TOKENS else f"  [extrapolated beyond position {max(args.contexts)}]"))


if __name__ == "__main__":
    main()
