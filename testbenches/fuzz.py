"""Config-space fuzzing (#16): seeded random configs of every block, each emitted and checked
bit-exact under Verilator against the golden model by the block's own testbench.

``random_config(block, rng)`` draws each parameter of the block's config class around its
smallest preset (integers log-uniformly in ``[1, 2 * value]`` with a size cap so that builds
and runs stay short, or over a range of their own: ``FIELD_RANGES``; floats in
``[0.5, 1.5] * value``, booleans at random) and keeps the first
draw that the config's ``validate()`` accepts; the rejected draws are the invalid configs,
which must fail with one line (a ``ConfigError``). ``python -m testbenches.fuzz`` (``make fuzz``)
runs many of them and prints each seed; any seed replays with ``--seed``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

from golden.cli import AtLeast
from golden.errors import ConfigError
from hdl.registry import BLOCKS, get_block

# Size parameters drawn from a smaller range (builds, simulated cycles); others: [1, 2 * default].
SIZE_CAPS = {"max_positions": 64, "max_centers": 16, "window": 32, "head_dim": 32, "heads": 4,
             "lanes": 8, "vpus": 8}
# Parameters drawn over a range of their own instead (uniformly when it is short, else
# log-uniformly): an SRAM bank up to several block-RAM banks deep, at every read latency; a MAC
# band from one key to far past max_positions (a band past 4 max_positions once wrapped the engine's key addresses).
FIELD_RANGES = {"depth": (2, 16384), "read_latency": (1, 6), "band": (1, 1024)}
# Parameters drawn from a generator of their own, seeded by the main one's state and leaving it as it
# was, so that adding them changed no recorded seed's draw of the others: name -> draw(values, rng).
# center_bits: the key itself half the time, else 2..kv_width-bit compact centers. group: 1..3 query
# heads, except for the blocks that serve one head (the registry's ``one_head``: the tile builds one
# of each per head). dsp_registers and with_exp (the SFM's) and stall_free (the VPU's and the SFM's): half
# the time.
SIDE_DRAWS = {"center_bits": lambda block, values, rng: 0 if rng.random() < 0.5 else rng.randint(2, max(2, values["kv_width"])),
              "group": lambda block, values, rng: 1 if get_block(block).one_head else rng.randint(1, 3),
              "dsp_registers": lambda block, values, rng: rng.random() < 0.5,
              "stall_free": lambda block, values, rng: rng.random() < 0.5,
              "with_exp": lambda block, values, rng: rng.random() < 0.5}


def families() -> dict[str, list[str]]:
    """Block families: the blocks that share a config class (the MAC unit's three blocks, the LAD
    tile and its four modules, ...), in registry order."""
    out: dict[str, list[str]] = {}
    for name, b in BLOCKS.items():
        out.setdefault(b.config_class.__name__, []).append(name)
    return out


def _draw(field, default, rng: random.Random):
    if isinstance(default, bool):
        return rng.random() < 0.5
    if isinstance(default, int) and field in FIELD_RANGES:
        lo, hi = FIELD_RANGES[field]
        return rng.randint(lo, hi) if hi - lo < 8 else int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
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
        out[f.name] = value if f.name in SIDE_DRAWS or rng.random() < keep else \
            _draw(f.name, value, rng)
    side = random.Random(repr(rng.getstate()))
    for name, draw in SIDE_DRAWS.items():
        if name in out:
            out[name] = draw(block, out, side)
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


# A step bench's sequence from reset is at most this many steps: a long run is several sequences
# (a LAD step at position n costs O(n) cycles; past max_positions a step is an exact pass).
SEQUENCE_STEPS = 256
# A long run is recorded in pieces of this many vectors (jobs of their own, seeds LONG_SEED_STRIDE
# apart): a run of a slow bench (mac-decode, the LAD tile: hours for 10,000) keeps what it has checked
# and a later --resume continues it.
LONG_CHUNK = 1000
LONG_SEED_STRIDE = 100
# bench parameters of a fuzz run beyond its length: mac-decode's steps with the query's reuse bit off
# (a layer in full_layers) among the others
BENCH_PARAMS = {"mac-decode": {"reuse_off": 0.1}}


def check(block: str, cfg, seed: int, vectors: int, name: str) -> dict:
    """``cfg`` under Verilator until ``vectors`` vectors are checked: one run for the vector benches;
    a step bench whose sequence is shorter (its metadata ends at ``max_positions``, one sequence is
    at most SEQUENCE_STEPS) runs further sequences from reset, seeds ``seed``, ``seed + 1``, ...
    Returns the summed report: vectors, mismatches, runs and the seeds run."""
    from testbenches.runner import simulate
    total, mismatches, seeds = 0, 0, []
    while total < vectors and not mismatches:
        s = seed + len(seeds)
        r = simulate(block, cfg, seed=s, name=name,
                     params={"vectors": vectors - total, "steps": min(vectors - total, SEQUENCE_STEPS),
                             **BENCH_PARAMS.get(block, {})})
        if not r["vectors"]:
            raise RuntimeError(f"{block} seed {s}: the run checked no vectors")
        total, mismatches = total + r["vectors"], mismatches + r["mismatches"]
        seeds.append(s)
    return {"vectors": total, "mismatches": mismatches, "runs": len(seeds), "seeds": seeds}


def config_of(kind: str, block: str, seed: int):
    """``(config, rejected draws)`` of a job: the seed's random config, or the default preset."""
    if kind == "config":
        return random_config(block, random.Random(f"{block}:{seed}"))
    return get_block(block).presets["default"], 0


def fuzz_one(block: str, seed: int, vectors: int = 100) -> dict:
    """The seed's random config, emitted and checked under Verilator on ``vectors`` random vectors
    (steps for the step-based benches, see :func:`check`); the summed report, with the config."""
    cfg, rejected = config_of("config", block, seed)
    report = check(block, cfg, seed, vectors, "fuzz")
    report.update(rejected=rejected, config=cfg.to_dict())
    return report


def stamp(block: str, cfg) -> dict:
    """What a result was run on: the config, its Verilog (sha1) and the bench's sources
    (:func:`bench_sources`, sha1). A resumed run reuses a result only when all three are the same."""
    import hashlib
    from hdl.generate import generate_verilog
    from testbenches.runner import bench_sources, fingerprint
    return {"config": cfg.to_dict(), "verilog": hashlib.sha1(generate_verilog(block, cfg).encode()).hexdigest()[:16],
            "bench": fingerprint(bench_sources(block))}


def _job(job: tuple, earlier: dict | None = None) -> tuple:
    """Run one job (``config``: a random config on ``vectors``; ``long``: the default preset), or
    return ``earlier``'s result when it was run on the same config, Verilog and bench."""
    kind, block, seed, vectors = job
    t = time.time()
    try:
        cfg, rejected = config_of(kind, block, seed)
        st = stamp(block, cfg)
        if earlier is not None and earlier.get("stamp") == st:
            return job, {**earlier, "reused": True}, None, earlier["seconds"]
        r = check(block, cfg, seed, vectors, "fuzz" if kind == "config" else "long")
        r.update(rejected=rejected, config=cfg.to_dict(), stamp=st)
        return job, r, None, time.time() - t
    except Exception as err:   # reported and counted: every failing seed is listed
        return job, None, str(err).splitlines()[0][:400] if str(err) else type(err).__name__, time.time() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbenches.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default="all",
                   help="comma-separated config classes, e.g. VpuConfig,LadTileConfig (default all); "
                        "a family's configs rotate over its blocks")
    p.add_argument("--blocks", default="", help="comma-separated blocks instead of families (each gets --count)")
    p.add_argument("--count", action=AtLeast, minimum=0, default=5, help="random configs per family (or per block with --blocks)")
    p.add_argument("--seed", type=int, default=1, help="first seed (seeds seed .. seed+count-1)")
    p.add_argument("--vectors", action=AtLeast, default=100, help="vectors (steps) per random config")
    p.add_argument("--long", action=AtLeast, minimum=0, default=0, metavar="N",
                   help="also run every block of the chosen families at its default preset on N vectors")
    p.add_argument("--jobs", action=AtLeast, default=1, help="configs checked at once (processes)")
    p.add_argument("--out", type=Path, default=None, help="JSON report, written as it goes")
    p.add_argument("--resume", type=Path, action="append", default=[],
                   help="a JSON report of an earlier run (may be repeated): reuse each result run on the same "
                        "config, Verilog and bench; run the rest")
    args = p.parse_args(argv)
    kept: dict = {}
    for report in args.resume:   # results reused where config, Verilog and bench are the same (see _job)
        if not report.is_file():
            p.error(f"--resume {report}: no such report")
        try:
            results = json.loads(report.read_text())["results"]
        except (ValueError, TypeError, KeyError):
            p.error(f"--resume {report}: not a report of this script (a JSON object with \"results\")")
        kept.update({(r["kind"], r["block"], r["seed"], r["vectors_asked"]): r for r in results if r.get("stamp")})
    fams = families()
    if args.blocks:
        unknown = [b for b in args.blocks.split(",") if b not in BLOCKS]
        if unknown:
            p.error(f"unknown block {unknown[0]!r} (one of {', '.join(BLOCKS)})")
        chosen = {b: [b] for b in args.blocks.split(",")}
    else:
        names = list(fams) if args.families == "all" else args.families.split(",")
        unknown = [f for f in names if f not in fams]
        if unknown:
            p.error(f"unknown family {unknown[0]!r} (one of {', '.join(fams)})")
        chosen = {f: fams[f] for f in names}
    seeds = range(args.seed, args.seed + args.count)
    jobs = [("config", blocks[(s - args.seed) % len(blocks)], s, args.vectors) for blocks in chosen.values() for s in seeds]
    if args.long:
        jobs += [("long", b, args.seed + LONG_SEED_STRIDE * i, min(LONG_CHUNK, args.long - LONG_CHUNK * i))
                 for blocks in chosen.values() for b in blocks for i in range(math.ceil(args.long / LONG_CHUNK))]
    t0, results = time.time(), []
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from tqdm import tqdm
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = as_completed([pool.submit(_job, job, kept.get(job)) for job in jobs])
        bar = tqdm((f.result() for f in done), total=len(jobs), desc="fuzz", file=sys.stderr)
        for (kind, block, seed, vectors), r, err, seconds in bar:
            what = f"{block:<10} {('seed ' if kind == 'config' else 'default ') + str(seed):<12}"
            if r is not None and r.get("reused"):
                rec = {k: v for k, v in r.items() if k != "reused"}
                bar.write(f"{what} {'PASS' if rec['passed'] else 'FAIL'} {rec['vectors']:>6} vectors (recorded: "
                          "same config, Verilog and bench)")
            else:
                rec = {"kind": kind, "block": block, "seed": seed, "vectors_asked": vectors,
                       "passed": err is None and r["mismatches"] == 0, "vectors": r["vectors"] if r else 0,
                       "run_seeds": r["seeds"] if r else None, "mismatches": r["mismatches"] if r else None,
                       "rejected": r["rejected"] if r else None, "config": r["config"] if r else None,
                       "stamp": r["stamp"] if r else None, "error": err, "seconds": round(seconds, 1)}
                result = (f"PASS {rec['vectors']:>6} vectors ({len(rec['run_seeds'])} runs), 0 mismatches, "
                          f"{rec['rejected']} invalid draws rejected, {seconds:5.1f} s" if rec["passed"] else
                          f"FAIL {err if err else str(rec['mismatches']) + ' mismatches'}")
                bar.write(f"{what} {result}  {rec['config'] or ''}")
            results.append(rec)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))
    passed = sum(r["passed"] for r in results)
    for fam, blocks in chosen.items() if args.count else ():
        rs = [r for r in results if r["block"] in blocks and r["kind"] == "config"]
        print(f"{fam:<16} {sum(r['passed'] for r in rs)} of {len(rs)} random configs pass "
              f"(seeds {args.seed}..{args.seed + args.count - 1}; "
              + ", ".join(f"{b} {sum(r['block'] == b for r in rs)}" for b in blocks) + ")")
    for block in dict.fromkeys(r["block"] for r in results if r["kind"] == "long"):
        rs = sorted((r for r in results if r["kind"] == "long" and r["block"] == block), key=lambda r: r["seed"])
        print(f"{block:<16} default preset: {sum(r['vectors'] for r in rs)} vectors in {len(rs)} pieces, "
              f"{sum(r['passed'] for r in rs)} pass (sequence seeds "
              + " ".join(str(s) for r in rs for s in r["run_seeds"] or []) + ")")
    print(f"fuzz: {passed} passed, {len(results) - passed} failed, {time.time() - t0:.0f} s")
    return 1 if passed < len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
