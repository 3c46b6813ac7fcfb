"""Replay a cover trace of the cut model on the real design (docs/verification.md, "Modes and
how each is proved": ``cover``).

A cover reached on the model whose datapath cells are cut to free values (FormalSpec.abstract)
shows a path of that over-approximation only. Replaying the trace's inputs (every port the
wrapper takes in, step by step) on the real block in Amaranth's simulator makes it a path of
the real design: the cover counts when its test holds there too, with every assumption of the
environment holding on the way (else the replay has left the environment and does not count).
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hdl.lib.verilog import part_ports

from .vcd import read_vcd


@dataclass
class Replay:
    hit: int | None             # the first step where the cover's test holds, None: not reached
    left_env: str | None = None   # the assumption that broke first ("name at step n"), if one did


def replay(top, trace_vcd, cover: str, force: dict | None = None, before: dict | None = None) -> Replay:
    """Drive ``top`` (a :class:`~testbenches.formal.harness.FormalWrapper` built with ``replay=True``
    around the real block) with the inputs of ``trace_vcd`` and look for ``cover``'s test.
    ``force``: input port name -> a value held in every step instead of the trace's; ``before``:
    input port name -> its values in the steps before the trace's (a prefixed task's run: its
    traces start in the state the run ends in), counted in the step ``hit`` reports."""
    table, steps = read_vcd(trace_vcd)
    table.update({name: [value] * steps for name, value in (force or {}).items()})
    if before:
        n = len(next(iter(before.values())))
        table = {name: list(before.get(name, [None] * n)) + list(values) for name, values in table.items()}
        steps += n
    ports = {name: value for name, (value, flow) in part_ports(top).items() if flow == In}
    missing = [name for name in ports if name not in table]
    if missing:
        raise ValueError(f"{trace_vcd}: no trace of the inputs {', '.join(missing)}")
    inputs = [(value, table[name]) for name, value in ports.items()]
    sim = Simulator(top)   # elaborates top: its tests exist from here on
    assumes = top.tests_of("assume")
    test = top.tests[cover][1]
    result = Replay(None)

    async def bench(ctx):
        for step in range(steps):
            for value, trace in inputs:
                ctx.set(value, trace[step] or 0)
            broken = [name for name, s in assumes if not ctx.get(s)]
            if broken:
                result.left_env = f"{broken[0]} at step {step}"
                return
            if ctx.get(test):
                result.hit = step
                return
            await ctx.tick()

    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return result
