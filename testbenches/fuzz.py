"""Config-space fuzzing (#16): seeded random configs of every block, each emitted and checked
bit-exact under Verilator against the golden model by the block's own testbench.

``random_config(block, rng)`` draws each parameter of the block's config class around its
smallest preset (integers log-uniformly in ``[1, 2 * value]`` with a size cap so that builds
and runs stay short, floats in ``[0.5, 1.5] * value``, booleans at random) and keeps the first
draw that the config's ``validate()`` accepts; the rejected draws are the invalid configs,
which must fail with one line (a ``ConfigError``). ``python -m testbenches.fuzz`` (``make fuzz``)
runs many of them and prints each seed; any seed replays with ``--seed``.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time

from golden.errors import ConfigError
from hdl.registry import BLOCKS, get_block

# Size parameters drawn from a smaller range (builds, simulated cycles); others: [1, 2 * default].
SIZE_CAPS = {"depth": 64, "max_positions": 64, "max_centers": 16, "window": 32, "head_dim": 32, "heads": 4,
             "lanes": 8, "vpus": 8}
# Only these blocks' fuzz runs are short enough for `make fuzz`'s default (the LAD modules and
# tile simulate whole decode steps; `--blocks` adds them).
DEFAULT_BLOCKS = ["vpu", "sfm", "sram", "mac-match", "mac-merge", "mac-unit", "dense"]


def _draw(field, default, rng: random.Random):
    if isinstance(default, bool):
        return rng.random() < 0.5
    if isinstance(default, int):
        hi = max(2, 2 * default)
        hi = min(hi, SIZE_CAPS.get(field, hi))
        if default == 0:
            return rng.randint(0, 4)
        return max(1, int(round(math.exp(rng.uniform(0, math.log(hi))))))
    if isinstance(default, float):
        return default * rng.uniform(0.5, 1.5)
    return default


def draw_raw(block: str, rng: random.Random, keep: float | None = None) -> dict:
    """One random assignment of the block's parameters around its smallest preset (each kept
    at the preset's value with probability ``keep``, itself drawn in [0.2, 0.8] by default),
    not yet validated."""
    b = get_block(block)
    keep = rng.uniform(0.2, 0.8) if keep is None else keep
    base = b.presets[b.smallest_preset]
    out = {}
    for f in dataclasses.fields(b.config_class):
        value = getattr(base, f.name)
        out[f.name] = value if rng.random() < keep else _draw(f.name, value, rng)
    return out


def random_config(block: str, rng: random.Random, tries: int = 2000):
    """``(config, rejected)``: the first valid draw and how many invalid draws came before it
    (each of which raised a one-line ConfigError)."""
    cls = get_block(block).config_class
    rejected = 0
    for _ in range(tries):
        values = draw_raw(block, rng)
        try:
            return cls(**values), rejected
        except ConfigError as err:
            message = str(err)
            assert "\n" not in message and message, f"multi-line or empty ConfigError: {message!r}"
            rejected += 1
    raise RuntimeError(f"no valid {block} config in {tries} draws")


def fuzz_one(block: str, seed: int, vectors: int = 100) -> dict:
    """Draw a config from ``seed``, emit it, check it under Verilator on ``vectors`` random
    vectors (steps for the step-based benches); the report of the run, with the config."""
    from testbenches.runner import simulate
    rng = random.Random(f"{block}:{seed}")
    cfg, rejected = random_config(block, rng)
    report = simulate(block, cfg, seed=seed, name="fuzz", params={"vectors": vectors, "steps": vectors})
    report.update(block=block, fuzz_seed=seed, rejected=rejected, config=cfg.to_dict())
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbenches.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", default=",".join(DEFAULT_BLOCKS), help="comma-separated blocks (or 'all')")
    p.add_argument("--count", type=int, default=5, help="random configs per block")
    p.add_argument("--seed", type=int, default=1, help="first seed (seeds seed .. seed+count-1)")
    p.add_argument("--vectors", type=int, default=100)
    args = p.parse_args(argv)
    blocks = list(BLOCKS) if args.blocks == "all" else args.blocks.split(",")
    t0, passed, failed = time.time(), 0, 0
    for block in blocks:
        for seed in range(args.seed, args.seed + args.count):
            t = time.time()
            try:
                r = fuzz_one(block, seed, args.vectors)
                passed += 1
                print(f"{block:<10} seed {seed:<5} PASS {r['vectors']:>5} vectors, {r['mismatches']} mismatches, "
                      f"{r['rejected']} invalid draws rejected, {time.time() - t:5.1f} s  {r['config']}", flush=True)
            except Exception as err:   # report and go on: every failing seed is listed
                failed += 1
                print(f"{block:<10} seed {seed:<5} FAIL {str(err).splitlines()[0][:400]}", flush=True)
    print(f"fuzz: {passed} passed, {failed} failed ({len(blocks)} blocks x {args.count} configs, "
          f"seeds {args.seed}..{args.seed + args.count - 1}, {time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
