"""Large submodules converted apart and in parallel (docs/architecture.md, "Verilog generation").

A parent adds each large submodule with :func:`add_part`. Outside :func:`collecting` (simulation,
formal, synthesis through RTLIL) that is ``m.submodules[name] = component``. While
:func:`hdl.generate.generate_verilog` converts the parent inside :func:`collecting`, the part
becomes an ``Instance`` of a module called ``name`` whose ports are the component's signature
members (named as Amaranth names a top's ports), and :func:`convert_parts` converts each part to
that module in a process of its own (forked: the component object is not pickled), linting each on
its own. The hardware is the same: a part's module is what a whole conversion would emit for that
submodule, under the part's name."""
from __future__ import annotations

import contextvars
import multiprocessing
import multiprocessing.connection
import os
import re
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path

from amaranth.hdl import ClockSignal, Instance, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from .verilog import lint_verilog, part_ports, to_verilog

_collector: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ladmac_parts", default=None)


def add_part(m, name: str, component: wiring.Component, module: str | None = None) -> None:
    """``m.submodules[name] = component``, or, while collecting, an instance ``name`` of the module
    ``module`` (default ``name``) that :func:`convert_parts` emits for it. Parts of one module (a
    KV group's per-head MDs and ACs) are one class at one ``cfg``: the module is converted once."""
    found = _collector.get()
    if found is None:
        m.submodules[name] = component
        return
    module = module or name
    component._MustUse__used = True   # elaborated in the part's own process, not here (no UnusedElaboratable)
    if module in found:
        first = found[module]
        same = type(first) is type(component) and hasattr(component, "cfg") and first.cfg == component.cfg
        if module == name or not same:
            raise ValueError(f"part {name!r}: module {module!r} is already another part's")
    found.setdefault(module, component)
    ports = {("i_" if flow == In else "o_") + port: value for port, (value, flow) in part_ports(component).items()}
    m.submodules[name] = Instance(module, i_clk=ClockSignal(), i_rst=ResetSignal(), **ports)


@contextmanager
def collecting():
    """Parts added while converting inside this block are collected (yielded dict of module name
    to component, in the order added) instead of elaborated in place."""
    found: dict = {}
    token = _collector.set(found)
    try:
        yield found
    finally:
        _collector.reset(token)


def port_stub(name: str, component: wiring.Component) -> str:
    """A Verilog module with the ports of part ``name`` and nothing inside: the parent is linted
    against these (names, directions, widths), each part on its own. They are the signals the
    part's module has as ports (:func:`convert_parts` checks the names against its header)."""
    decls = ["input clk", "input rst"]
    for port, (value, flow) in part_ports(component).items():
        width = len(value)
        decls.append(f"{'input' if flow == In else 'output'} {f'[{width - 1}:0] ' if width > 1 else ''}{port}")
    return f"module {name}({', '.join(decls)});\nendmodule\n"


def _check_header(name: str, component: wiring.Component, text: str) -> None:
    """The part's module has exactly the ports its instance and its stub name."""
    header = re.search(rf"^module {re.escape(name)}\((.*?)\);", text, re.M | re.S)
    found = {port.strip() for port in header.group(1).split(",")} if header else set()
    expected = {"clk", "rst", *part_ports(component)}
    if found != expected:
        raise RuntimeError(f"part {name!r}: its module's ports differ from its instance's "
                           f"(missing {sorted(expected - found)}, extra {sorted(found - expected)})")


def _convert_one(name, component, lint, out: Path) -> None:
    """In a forked child: the part's Verilog (and, with ``lint``, its lint) into ``out``."""
    _collector.set(None)   # a part's own add_part calls elaborate in place
    try:
        text = to_verilog(component, name)
        out.write_text(text)
        if lint:
            lint_verilog(out, top=name)
        os._exit(0)
    except BaseException:
        out.with_suffix(".error").write_text(traceback.format_exc())
        os._exit(1)


def convert_parts(parts: dict, lint: bool = False, jobs: int | None = None) -> list[str]:
    """The Verilog of each collected part, converted ``jobs`` at a time (default: the CPUs this
    process may use) in the order added; raises with the child's traceback if one fails."""
    jobs = jobs or len(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="ladmac-parts-") as tmp:
        outs = {name: Path(tmp) / f"{name}.v" for name in parts}
        waiting, running = list(parts), []
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                child = ctx.Process(target=_convert_one, args=(name, parts[name], lint, outs[name]))
                child.start()
                running.append((name, child))
            ready = multiprocessing.connection.wait([child.sentinel for _, child in running])
            done = next(i for i, (_, child) in enumerate(running) if child.sentinel in ready)
            name, child = running.pop(done)
            child.join()
            if child.exitcode != 0:
                for _, other in running:
                    other.kill()
                error = outs[name].with_suffix(".error")
                raise RuntimeError(f"converting part {name!r} failed:\n"
                                   + (error.read_text() if error.exists() else f"exit code {child.exitcode}"))
        texts = [outs[name].read_text() for name in parts]
    for (name, component), text in zip(parts.items(), texts):
        _check_header(name, component, text)
    return texts
