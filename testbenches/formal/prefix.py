"""A simulated prefix for the formal tasks of blocks whose first output is deeper than a solver
reaches from reset (docs/verification.md, "Modes": ``prefix``).

:func:`simulate` runs the block's formal wrapper (``replay=True``) in Amaranth's simulator from
reset under a seeded environment that keeps every assumption: the spec's first input (the
``inp`` of its first counting rule) offered with random payloads that meet the input contract,
every request answered with random data once asked, every output ready three cycles in four
(any other input stays 0).
It records each input port per cycle, checks the wrapper's assertions and notes its covers in
every cycle; :func:`smtc` writes the inputs as yosys-smtbmc constraints on steps
``0..cycles-1``. A task with the prefix skips those steps in the solver (SymbiYosys ``skip``:
the simulation checked them) and checks *every* path that continues the run (inputs free
again) from step ``cycles`` to the task's depth.
"""
from __future__ import annotations

import random

from dataclasses import dataclass, field

from amaranth import Value
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hdl.lib.verilog import part_ports

from .harness import port


@dataclass
class Run:
    inputs: dict[str, list[int]]                        # input port name -> its value per cycle
    covers: dict[str, int] = field(default_factory=dict)    # cover -> the first cycle it held
    failed: dict[str, int] = field(default_factory=dict)    # assertion -> the first cycle it broke


def simulate(top, rules: dict, cycles: int, seed: int = 1) -> Run:
    """``cycles`` cycles of ``top`` (a replay wrapper) from reset under the seeded environment."""
    rng = random.Random(seed)
    ports = {name: value for name, (value, flow) in part_ports(top).items() if flow == In}
    first = rules["counts"][0].inp
    responses = {r.resp: r for r in rules.get("responses", ())}
    run = Run({name: [] for name in ports})
    sim = Simulator(top)   # elaborates top: its tests exist from here on
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

    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return run


def smtc(record: dict[str, list[int]], widths: dict[str, int]) -> str:
    """yosys-smtbmc constraints: every recorded input equal to its value in each step."""
    lines = []
    steps = len(next(iter(record.values())))
    for step in range(steps):
        lines.append(f"state {step}")
        for name, values in record.items():
            v = values[step]
            value = ("true" if v else "false") if widths[name] == 1 else f"#b{v:0{widths[name]}b}"
            lines.append(f"assume (= [{name}] {value})")
        lines.append("")
    return "\n".join(lines)
