"""`ladmac synth`: synthesise one block (or every block) and print / save the reports.

    ladmac synth BLOCK [--set NAME=VALUE ...] [--preset P] [--target ecp5|generic]
                       [--freq MHZ] [--seeds N] [--out report.json] [--bitstream] [--net-timings] [--no-cache]
    ladmac synth --all [--doc docs/synthesis.md] [--out all.json] [--seeds N]
    ladmac synth BLOCK BLOCK ... [--doc docs/synthesis.md] [--seeds N]
    ladmac synth --all --from-records --doc docs/synthesis.md [--seeds N]

Fmax is nextpnr's post-route figure, the mean over placement seeds 1..N: N = 1 for one
BLOCK (quick), 3 for --all (`make synth`) or several BLOCKs unless --seeds says otherwise.
Several BLOCKs run at their default configs, like --all over those blocks only (the doc
then names the command and the blocks it covers).

Results recorded with ``--out`` under benchmarks/results/ (``synth-*.json``) stand in for the
cache: a run whose key (Verilog, config, flow, tools) and seed count match a record reads it instead of
routing again, so a fresh clone's `make synth` re-runs only the blocks changed since they were
recorded (see `recorded_results`). ``--from-records`` routes nothing: the page comes from each
block's record at its doc config and seed count, and a record routed from Verilog other than the
block's current one is marked as such (`record_for`).

Bad input (unknown block, bad parameter, a design that does not fit the device) prints
one line ``ladmac: error: ...`` and returns 2.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from golden.cli import AtLeast, Parser, add_overrides, parse_overrides
from golden.errors import ConfigError, LadmacError


RECORDS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _records(records: Path):
    """``(path, report)`` for each report recorded in ``records`` (``synth-*.json``: one report or a list)."""
    for path in sorted(records.glob("synth-*.json")):
        data = json.loads(path.read_text())
        for r in data if isinstance(data, list) else [data]:
            if isinstance(r, dict):
                yield path, r


def _seed_count(r: dict) -> int:
    return len((r.get("ecp5") or {}).get("fmax_seeds_mhz") or [None])


def recorded_results(records: Path | None = None) -> int:
    """Write each recorded report (``ladmac synth --out`` saved as ``synth-*.json`` in ``records``,
    benchmarks/results by default) into the run cache as its key's ``result-seedsN.json`` where
    that is missing; returns how many it wrote. The record's bitstream file is not here, so its
    ``bitstream`` entry becomes ``bitstream_recorded`` (its size) and ``--bitstream`` routes again."""
    from . import flow
    records = records or RECORDS
    wrote = 0
    for path, r in _records(records):
        if not r.get("key") or not r.get("block") or r.get("error"):
            continue
        cached = flow.run_dir(r["block"], r["key"]) / f"result-seeds{_seed_count(r)}.json"
        if cached.exists():
            continue
        r = {**r, "recorded_in": str(path.relative_to(records.parent.parent)), "dir": str(cached.parent)}
        if (r.get("ecp5") or {}).get("bitstream"):
            r["ecp5"] = {**r["ecp5"], "bitstream_recorded": r["ecp5"]["bitstream"]["bytes"]}
            del r["ecp5"]["bitstream"]
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(r, indent=1))
        wrote += 1
    return wrote


def _commit_time(path: Path) -> float:
    """When ``path`` was last committed (its modification time outside a git checkout)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return float(out) if out else path.stat().st_mtime


def record_for(block: str, cfg, preset: str | None, verilog_sha256: str, seeds: int,
               records: Path | None = None) -> dict | None:
    """The record (``synth-*.json`` in ``records``) of ``block`` at ``preset`` routed over ``seeds``
    seeds: the one routed from ``verilog_sha256`` (the block's current Verilog at ``cfg``), else the
    newest committed at ``cfg`` (each field the record has), else the newest, with ``stale`` set to
    its file (routed from an earlier version of the block's Verilog or config); None when there is
    no such record."""
    records = records or RECORDS
    now = cfg.to_dict()   # (a field the record lacks was added after it: its value is not compared)
    found = []
    for path, r in _records(records):
        if r.get("ecp5") and r.get("block") == block and r.get("preset") == preset and _seed_count(r) == seeds:
            same_config = all(now.get(k, v) == v for k, v in r.get("config", {}).items())
            found.append((r.get("verilog_sha256") == verilog_sha256, same_config, _commit_time(path), path, r))
    if not found:
        return None
    current, _, _, path, r = max(found, key=lambda f: f[:3])
    where = str(path.relative_to(records.parent.parent))
    return {**r, "recorded_in": where, **({} if current else {"stale": where})}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ladmac synth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("block", nargs="*", help="block name(s) (see `ladmac blocks`)")
    p.add_argument("--all", action="store_true", help="every block at its default config")
    add_overrides(p)
    p.add_argument("--preset", help="start from a named preset")
    p.add_argument("--target", default="ecp5", choices=["ecp5", "generic"],
                   help="ecp5: harness + yosys + nextpnr on the ULX3S 85F (and the generic count); "
                        "generic: technology-independent cell count only")
    p.add_argument("--freq", type=float, default=100.0, metavar="MHZ", help="PLL clock / timing target (100)")
    p.add_argument("--seeds", action=AtLeast, default=None, metavar="N",
                   help="nextpnr placement seeds 1..N, Fmax is their mean (default 1 for one BLOCK, 3 for --all)")
    p.add_argument("--out", help="write the report(s) as JSON here")
    p.add_argument("--doc", help="with --all or several BLOCKs: write the Markdown summary here (e.g. docs/synthesis.md)")
    p.add_argument("--bitstream", action="store_true",
                   help="also write the ULX3S bitstream (nextpnr --textcfg, then yowasp-ecppack)")
    p.add_argument("--net-timings", action="store_true",
                   help="nextpnr --detailed-timing-report: each seed's report also gives every endpoint's routed "
                        "delay (`python -m benchmarks.netlist_paths RUN/ecp5 --routed RUN/ecp5/report.json` "
                        "lists those past a threshold); reporting only, the same route")
    p.add_argument("--no-cache", dest="cache", action="store_false", help="ignore cached results")
    p.add_argument("--from-records", action="store_true",
                   help="with --doc: route nothing, render the page from each block's record in "
                        "benchmarks/results (marking those routed from an earlier version of the block)")
    return p


def _pct(used, have):
    return f"{100.0 * used / have:5.1f}%" if have else "    -"


def format_report(r: dict) -> str:
    """Human-readable table of one report."""
    lines = []
    cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
    lines.append(f"{r['block']} ({r['preset'] or 'default'} config: {cfg})")
    if r.get("error"):
        lines.append(f"  {r['error']}")
    e = r.get("ecp5")
    if e:
        d = e["device"]
        lines.append(f"  {d['device']} {d['package']} speed {d['speed']} ({d['board']} board, "
                     f"{d['board_clock_mhz']:g} MHz -> PLL {e['pll']['f_out']:g} MHz)")
        util = e["utilisation"]
        avail = {"LUT4": util.get("TRELLIS_COMB", {}).get("available", 83640),
                 "FF": util.get("TRELLIS_FF", {}).get("available", 83640),
                 "DP16KD": 208, "MULT18X18D": 156}
        for k in ("DP16KD", "MULT18X18D"):
            avail[k] = util.get(k, {}).get("available", avail[k])
        lines.append(f"  {'resource':<12}{'core':>8}{'+harness':>10}{'device':>8}{'core use':>10}")
        for res in ("LUT4", "FF", "DP16KD", "MULT18X18D"):
            lines.append(f"  {res:<12}{e['core'][res]:>8}{e['design'][res]:>10}{avail[res]:>8}"
                         f"{_pct(e['core'][res], avail[res]):>10}")
        from .flow import goal_mhz
        goal = goal_mhz(r["block"])
        verdict = "meets" if e["fmax_mhz"] >= goal else "MISSES"
        seeds = e.get("fmax_seeds_mhz") or [e["fmax_mhz"]]
        over = (f", mean of {len(seeds)} seeds: " + " / ".join(f"{f:.1f}" for f in seeds)) if len(seeds) > 1 else ""
        lines.append(f"  Fmax {e['fmax_mhz']:.1f} MHz ({verdict} the {goal:g} MHz goal{over})")
        cp = e["critical_path"]
        if cp:
            split = " + ".join(f"{k} {v:.2f}" for k, v in cp["split_ns"].items())
            lines.append(f"  critical path {cp['delay_ns']:.2f} ns, {cp['logic_levels']} logic levels ({split} ns)")
            lines.append(f"    from {cp['from']} ({cp['from_owner']})")
            lines.append(f"    to   {cp['to']} ({cp['to_owner']})")
            if cp.get("diagnosis"):
                lines.append(f"    why: {cp['diagnosis']}")
            if cp["sources"]:
                lines.append(f"    RTL: {', '.join(cp['sources'][:6])}")
        h = e["harness"]
        lines.append(f"  harness: {h['in_bits']} input bits in {h['load_cycles']} cycles over 8 pins, "
                     f"{h['out_bits']} output bits out in {h['unload_cycles']} cycles, {h['ff']} FFs")
        if e.get("bitstream"):
            lines.append(f"  bitstream: {e['bitstream']['bit']} ({e['bitstream']['bytes']} bytes)")
    g = r.get("generic")
    if g:
        lines.append(f"  generic: {g['num_cells']} cells ({g['logic_cells']} gates, {g['ff']} FFs), "
                     f"{g['memory_bits']} memory bits; est. area {g['ge']['total']} GE, "
                     f"memory {100 * g['ge']['memory_share']:.0f}%")
    if r.get("cached") and r.get("recorded_in"):
        lines.append(f"  (recorded in {r['recorded_in']})")
    else:
        took = "cached" if r.get("cached") else f"{r.get('seconds', 0):.0f} s"
        lines.append(f"  ({took}; files in {r['dir']})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from hdl.registry import BLOCKS, get_block, make_config
    from . import doc, flow
    try:
        args = build_parser().parse_args(argv)
        if args.all == bool(args.block):
            raise ConfigError("give one BLOCK (or several) or --all")
        many = args.all or len(args.block) > 1
        if args.doc and not many:
            raise ConfigError("--doc needs --all or several BLOCKs")
        if args.from_records and not args.doc:
            raise ConfigError("--from-records renders a page: give --doc")
        if many and (args.set or args.preset):
            raise ConfigError("--all / several BLOCKs run at their default configs; --set/--preset need one BLOCK")
        names = list(BLOCKS) if args.all else list(args.block)
        seeds = args.seeds if args.seeds is not None else (flow.DOC_SEEDS if many else flow.DEFAULT_SEEDS)
        if args.net_timings and "--detailed-timing-report" not in flow.NEXTPNR_OPTS:
            flow.NEXTPNR_OPTS.append("--detailed-timing-report")   # not in the run's key: it changes no route
        if args.cache and not args.from_records:   # (--from-records reads the records themselves)
            recorded_results()
        results = []
        for name in names:
            get_block(name)
            preset = flow.DOC_PRESETS.get(name) if many else args.preset
            cfg = make_config(name, parse_overrides(args.set), preset)
            if args.from_records:
                from hdl.generate import generate_verilog
                sha = hashlib.sha256(generate_verilog(name, cfg).encode()).hexdigest()
                r = record_for(name, cfg, preset, sha, seeds) or {"block": name, "preset": preset,
                                                           "not_measured": f"no record at {seeds} seeds"}
                print(f"{name}: " + (f"{r['ecp5']['fmax_mhz']:.1f} MHz, {r['recorded_in']}"
                                     + (" (routed from an earlier version)" if r.get("stale") else "")
                                     if r.get("ecp5") else r["not_measured"]), flush=True)
                results.append(r)
                continue
            t0 = time.time()
            log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
            try:
                r = flow.synthesize(name, cfg, target=args.target, freq_mhz=args.freq, bitstream=args.bitstream,
                                    use_cache=args.cache, preset=preset, log=log, seeds=seeds)
            except flow.DoesNotFit as err:   # --all: a block that does not fit gets its row and generic count
                if not many:
                    raise
                r = flow.synthesize(name, cfg, target="generic", freq_mhz=args.freq, use_cache=args.cache,
                                    preset=preset, log=log)
                r["error"] = str(err)
            doc.reannotate(r)
            r["wall_s"] = round(time.time() - t0, 1)
            results.append(r)
            print(format_report(r), flush=True)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results if many else results[0], indent=1))
        if args.doc:
            path = Path(args.doc)
            path.parent.mkdir(parents=True, exist_ok=True)
            command = (None if args.all and not args.from_records else
                       "ladmac synth " + ("--all" if args.all else " ".join(names))
                       + (" --from-records" if args.from_records else "")
                       + (f" --seeds {args.seeds}" if args.seeds is not None else "") + f" --doc {args.doc}")
            path.write_text(doc.render(results, command=command))
            print(f"wrote {path}", file=sys.stderr)
        return 0
    except LadmacError as err:
        print(f"ladmac: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"ladmac: error: {err}", file=sys.stderr)
        return 2
