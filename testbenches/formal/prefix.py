"""A simulated prefix for the formal tasks of blocks whose first output is deeper than a solver
reaches from reset (docs/verification.md, "Modes": ``prefix``).

:func:`simulate` runs the block's formal wrapper (``replay=True``) in Amaranth's simulator from
reset under a seeded environment that keeps every assumption: the spec's first input (the
``inp`` of its first counting rule) offered with random payloads that meet the input contract,
every request answered with random data once asked, every output ready three cycles in four
(any other input stays 0).
It records each input port per cycle, checks the wrapper's assertions and notes its covers in
every cycle, and keeps the state the run ends in: every register, memory row and synchronous
read port's output. :func:`continuation` is the same elaborated wrapper starting in that state
(the values as initial values, each replay test an Assert / Assume / Cover again): the solver
checks *every* path that continues the run, from its cycle ``cycles`` on, without unrolling the
prefix (SymbiYosys' ``skip`` over a prefix of pinned inputs makes one formula of all its steps,
which the tile's does not finish). :func:`smtc` writes the inputs as yosys-smtbmc constraints
(the run's record).
"""
from __future__ import annotations

import random
import re

from dataclasses import dataclass, field

from amaranth import Module, Value, unsigned
from amaranth.back import rtlil
from amaranth.hdl import Assert, Assume, Cover, Fragment, MemoryData
from amaranth.hdl._ast import SignalSet
from amaranth.hdl._mem import MemoryInstance
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hdl.lib.verilog import part_ports

from .harness import _named, port


@dataclass
class Run:
    inputs: dict[str, list[int]]                        # input port name -> its value per cycle
    outputs: dict[str, list[int]] = field(default_factory=dict)   # output port name -> its value per cycle
    covers: dict[str, int] = field(default_factory=dict)    # cover -> the first cycle it held
    failed: dict[str, int] = field(default_factory=dict)    # assertion -> the first cycle it broke
    fragment: Fragment | None = None    # the wrapper as elaborated and simulated
    state: list = field(default_factory=list)      # (register, its value after the last cycle)
    memories: list = field(default_factory=list)   # (MemoryData, its rows after the last cycle)
    read_data: list = field(default_factory=list)  # (a synchronous read port's data signal, its value)


def _fragments(fragment: Fragment):
    yield fragment
    for sub, _name, _src_loc in fragment.subfragments:
        yield from _fragments(sub)


def _state(fragment: Fragment):
    """``(registers, memories, read port outputs)`` of ``fragment``'s tree: what a clock edge
    keeps (the signals a clocked domain drives, memory rows, synchronous read ports' data)."""
    registers, memories, read_data = SignalSet(), [], SignalSet()
    for f in _fragments(fragment):
        for domain, statements in f.statements.items():
            if domain != "comb":
                for statement in statements:
                    registers |= statement._lhs_signals()
        if isinstance(f, MemoryInstance):
            memories.append(f._data)
            for read in f._read_ports:
                if read._domain != "comb":
                    read_data |= read._data._lhs_signals()
    return list(registers), memories, list(read_data)


def simulate(top, rules: dict, cycles: int, seed: int = 1) -> Run:
    """``cycles`` cycles of ``top`` (a replay wrapper) from reset under the seeded environment."""
    rng = random.Random(seed)
    ports = {name: value for name, (value, flow) in part_ports(top).items() if flow == In}
    outputs = {name: value for name, (value, flow) in part_ports(top).items() if flow != In}
    first = rules["counts"][0].inp
    responses = {r.resp: r for r in rules.get("responses", ())}
    run = Run({name: [] for name in ports}, {name: [] for name in outputs}, fragment=Fragment.get(top, None))   # top's tests exist from here on
    registers, memories, read_data = _state(run.fragment)
    # the simulator's preparation adds the missing clock domain to the fragments; undone after
    # the run, so that the same fragment converts again (continuation)
    domains = [(f, dict(f.domains)) for f in _fragments(run.fragment)]
    sim = Simulator(run.fragment)
    tests = {kind: top.tests_of(kind) for kind in ("assume", "assert", "cover")}
    assumes = tests["assume"]
    contracts = [s for name, s in assumes if name.startswith("contract")]

    async def bench(ctx):
        outstanding = dict.fromkeys(responses, 0)
        free = dict.fromkeys(list(responses) + [first], True)   # may change valid / payload
        for cycle in range(cycles):
            for name, value in ports.items():
                if name.endswith("__ready"):   # back-pressure a quarter of the cycles
                    ctx.set(value, rng.random() >= 0.25)
            for name in free:
                if not free[name]:
                    continue
                s = port(top, name)
                payload = Value.cast(s.payload)
                if name == first:
                    ctx.set(s.valid, 1)
                    for attempt in range(1000):   # a payload that meets the input contract: fewer
                        bits = rng.getrandbits(len(payload))   # ones the longer it takes (small fields)
                        for _ in range(attempt // 100):
                            bits &= rng.getrandbits(len(payload))
                        ctx.set(payload, bits)
                        if all(ctx.get(c) for c in contracts):
                            break
                    else:
                        raise RuntimeError(f"no payload of {name} meets the contract")
                else:
                    ctx.set(s.valid, outstanding[name] > 0)
                    ctx.set(payload, rng.getrandbits(len(payload)))
            broken = [name for name, s in assumes if not ctx.get(s)]
            if broken:
                raise RuntimeError(f"the prefix's environment breaks {broken[0]} at cycle {cycle}")
            for name, value in ports.items():
                run.inputs[name].append(ctx.get(value))
            for name, value in outputs.items():
                run.outputs[name].append(ctx.get(value))
            for kind, found in (("assert", run.failed), ("cover", run.covers)):
                for name, s in tests[kind]:
                    if name not in found and bool(ctx.get(s)) == (kind == "cover"):
                        found[name] = cycle
            for name in free:
                s = port(top, name)
                free[name] = not ctx.get(s.valid) or bool(ctx.get(s.ready))
            for r in responses.values():
                req, resp = port(top, r.req), port(top, r.resp)
                if ctx.get(req.valid) and ctx.get(req.ready):
                    outstanding[r.resp] += ctx.get(r.per(req.payload)) if callable(r.per) else r.per
                if ctx.get(resp.valid) and ctx.get(resp.ready):
                    outstanding[r.resp] -= 1
            await ctx.tick()
        run.state = [(s, ctx.get(s)) for s in registers]
        run.memories = [(data, [ctx.get(Value.cast(data[row])) for row in range(data.depth)]) for data in memories]
        run.read_data = [(s, ctx.get(s)) for s in read_data]

    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for f, kept in domains:
        f.domains = kept
    return run


def continuation(top, run: Run, ports: dict) -> str:
    """RTLIL of ``top`` (the replay wrapper ``run`` simulated) starting in the state the run ended
    in, its tests properties again (Assert / Assume / Cover). Amaranth emits a synchronous read
    port's output register with no initial value (its ``$memrd_v2`` cell's ``INIT_VALUE`` is
    undefined, RFC 54 pending), so that value is written into the cell, found through the name
    Amaranth gave the port's data signal and the module's connections to it."""
    for signal, value in run.state:
        signal._init = value
    for data, rows in run.memories:   # as raw rows: the conversion reads Init._raw
        data._init = MemoryData.Init(rows, shape=unsigned(Value.cast(data[0]).shape().width), depth=data.depth)
    m = Module()
    m.submodules.wrapper = run.fragment
    kinds = {"assert": Assert, "assume": Assume, "cover": Cover}
    for name, (kind, test) in top.tests.items():
        m.d.comb += _named(kinds[kind](test), name)
    text, names = rtlil.convert_fragment(Fragment.get(m, None), ports, "top", emit_src=True)
    for signal, value in run.read_data:
        *module, wire = names[signal]
        text = _set_read_init(text, ".".join(module), wire, len(signal), value & ((1 << len(signal)) - 1))
    return text


def _set_read_init(text: str, module: str, wire: str, width: int, value: int) -> str:
    """``text`` with the ``INIT_VALUE`` of the read port cell of ``module`` whose data is ``wire``
    (or a wire that ``module`` connects to it whole) set to ``value``."""
    head = text.index(f"module \\{module}\n")
    tail = text.index("\nend\n", head)
    body = text[head:tail]

    def whole(spec):   # a sigspec of width bits, its full-width slice written as the wire
        return spec.removesuffix(f" [{width - 1}:0]")
    aliases = {f"\\{wire}"}
    for a, b in re.findall(r"^ {0,2}connect (\S+(?: \[\d+:\d+\])?) (\S+(?: \[\d+:\d+\])?)$", body, re.M):
        if whole(a) == f"\\{wire}":
            aliases.add(whole(b))
        elif whole(b) == f"\\{wire}":
            aliases.add(whole(a))
    cells = [c for c in re.finditer(r"  cell \$memrd_v2 .*?\n  end\n", body, re.S)
             if "CLK_ENABLE 1\n" in c.group(0)
             and whole(re.search(r"connect \\DATA (.*)\n", c.group(0)).group(1)) in aliases]
    if len(cells) != 1:
        raise RuntimeError(f"{len(cells)} read port cells of {module} drive {wire}: its state cannot be set")
    cell = re.sub(r"(parameter \\INIT_VALUE )\d+'[01x]+", rf"\g<1>{width}'{value:0{width}b}", cells[0].group(0))
    return text[:head] + body[:cells[0].start()] + cell + body[cells[0].end():] + text[tail:]


def smtc(record: dict[str, list[int]], widths: dict[str, int], asserted: dict[str, list[int]] | None = None) -> str:
    """yosys-smtbmc constraints: every recorded input equal to its value in each step (assumed),
    and every port of ``asserted`` equal to its value there (asserted)."""
    lines = []
    steps = len(next(iter(record.values())))
    for step in range(steps):
        lines.append(f"state {step}")
        for kind, table in (("assume", record), ("assert", asserted or {})):
            for name, values in table.items():
                v = values[step]
                value = ("true" if v else "false") if widths[name] == 1 else f"#b{v:0{widths[name]}b}"
                lines.append(f"{kind} (= [{name}] {value})")
        lines.append("")
    return "\n".join(lines)
