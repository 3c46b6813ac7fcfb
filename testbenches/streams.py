"""The one stream driver: cocotb source and sink for ``amaranth.lib.stream`` ports.

Payloads are packed and unpacked through the same ``amaranth.lib.data`` layouts the
RTL uses. Sources insert random idle cycles between items (valid never depends on
ready and, once raised, is held until the transfer); sinks drop ready at random
(back-pressure). Every transfer is recorded with its cycle number.
"""
from __future__ import annotations

import json
import os
import random
from collections import deque

import cocotb
from amaranth import Shape
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge


def pack(shape, item) -> int:
    """Bits of ``item`` (nested dict/list/int) in ``shape``."""
    if isinstance(shape, data.Layout):
        bits = 0
        for key, field in shape:
            bits |= pack(field.shape, item[key]) << field.offset
        return bits
    width = Shape.cast(shape).width
    return int(item) & ((1 << width) - 1)


def unpack(shape, bits: int):
    """Inverse of :func:`pack`: dicts for structs, lists for arrays, ints for scalars."""
    if isinstance(shape, data.ArrayLayout):
        return [unpack(field.shape, bits >> field.offset) for _, field in shape]
    if isinstance(shape, data.Layout):
        return {key: unpack(field.shape, bits >> field.offset) for key, field in shape}
    s = Shape.cast(shape)
    value = bits & ((1 << s.width) - 1)
    if s.signed and value >> (s.width - 1):
        value -= 1 << s.width
    return value


class Cycles:
    """Counts rising edges; read ``.now`` in the ReadOnly phase."""

    def __init__(self, clk):
        self.clk, self.now = clk, 0
        cocotb.start_soon(self._count())

    async def _count(self):
        while True:
            await RisingEdge(self.clk)
            self.now += 1


class StreamSource:
    """Sends queued items on ``<prefix>__valid/payload`` with random idle gaps."""

    def __init__(self, dut, prefix, shape, cycles: Cycles, rng: random.Random, gap: float = 0.3):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.shape, self.cycles, self.rng, self.gap = shape, cycles, rng, gap
        self.queue: deque = deque()
        self.sent: list[tuple[int, object]] = []
        self.valid.value = 0
        cocotb.start_soon(self._run())

    def put(self, item) -> None:
        self.queue.append(item)

    @property
    def idle(self) -> bool:
        return not self.queue and self._current is None

    _current = None

    async def _run(self):
        clk = self.cycles.clk
        while True:
            await RisingEdge(clk)
            if self._current is None and self.queue and self.rng.random() >= self.gap:
                self._current = self.queue.popleft()
                self.payload.value = pack(self.shape, self._current)
                self.valid.value = 1
            elif self._current is None:
                self.valid.value = 0
            await ReadOnly()
            if self._current is not None and int(self.ready.value):
                self.sent.append((self.cycles.now, self._current))
                self._current = None


class StreamSink:
    """Takes items from ``<prefix>__valid/payload`` with random back-pressure on ready."""

    def __init__(self, dut, prefix, shape, cycles: Cycles, rng: random.Random, stall: float = 0.3):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.shape, self.cycles, self.rng, self.stall = shape, cycles, rng, stall
        self.received: list[tuple[int, object]] = []
        self.ready.value = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        clk = self.cycles.clk
        while True:
            await RisingEdge(clk)
            ready = self.rng.random() >= self.stall
            self.ready.value = int(ready)
            await ReadOnly()
            if ready and int(self.valid.value):
                self.received.append((self.cycles.now, unpack(self.shape, self.payload.value.to_unsigned())))

    async def wait_for(self, count: int, timeout_cycles: int):
        start = self.cycles.now
        while len(self.received) < count:
            await RisingEdge(self.cycles.clk)
            if self.cycles.now - start > timeout_cycles:
                raise AssertionError(
                    f"timeout: {len(self.received)}/{count} items after {timeout_cycles} cycles")


# -- test context passed by testbenches/runner.py -----------------------------------
class Context:
    """Config, seed, parameters and report of one simulation run."""

    def __init__(self, config_class):
        self.cfg = config_class.from_json(os.environ["LADMAC_CONFIG"])
        self.seed = int(os.environ["LADMAC_SEED"])
        self.params = json.loads(os.environ.get("LADMAC_PARAMS", "{}"))
        self.rng = random.Random(self.seed)
        self.report: dict = {"seed": self.seed, "config": self.cfg.to_dict()}

    def write_report(self) -> None:
        with open(os.environ["LADMAC_REPORT"], "w") as f:
            json.dump(self.report, f, indent=1)


async def start(dut, period_ns: int = 10) -> Cycles:
    """Start the clock, hold reset for two cycles, return the cycle counter."""
    Clock(dut.clk, period_ns, unit="ns").start()
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    return Cycles(dut.clk)


class StreamMemory:
    """A main-memory model behind a request/response stream pair: random back-pressure on
    requests, in-order responses after a random latency, random gaps on responses.
    ``lookup(request) -> response item`` gives the data."""

    def __init__(self, dut, req_prefix, req_shape, resp_prefix, resp_shape, cycles: Cycles, rng, lookup,
                 latency=(1, 8), stall: float = 0.2, gap: float = 0.2):
        self.requests = StreamSink(dut, req_prefix, req_shape, cycles, rng, stall=stall)
        self.responses = StreamSource(dut, resp_prefix, resp_shape, cycles, rng, gap=gap)
        self.cycles, self.rng, self.lookup, self.latency = cycles, rng, lookup, latency
        self._pending: deque = deque()
        cocotb.start_soon(self._run())

    async def _run(self):
        taken, ready_at = 0, 0
        while True:
            await RisingEdge(self.cycles.clk)
            while taken < len(self.requests.received):
                cycle, request = self.requests.received[taken]
                ready_at = max(ready_at, cycle + self.rng.randint(*self.latency))
                self._pending.append((ready_at, request))
                taken += 1
            while self._pending and self._pending[0][0] <= self.cycles.now:
                self.responses.put(self.lookup(self._pending.popleft()[1]))


async def wait_until(cycles: Cycles, condition, timeout_cycles: int, what: str = "condition") -> None:
    """Wait clock by clock until ``condition()`` holds in the ReadOnly phase; return after the
    next rising edge, where the caller may drive inputs again. Call it outside ReadOnly."""
    start_cycle = cycles.now
    while True:
        await ReadOnly()
        if condition():
            break
        await RisingEdge(cycles.clk)
        if cycles.now - start_cycle > timeout_cycles:
            raise AssertionError(f"timeout: {what} not reached after {timeout_cycles} cycles")
    await RisingEdge(cycles.clk)
