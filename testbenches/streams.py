"""The shared testbench layer: cocotb stream drivers for ``amaranth.lib.stream`` ports and the
:class:`Bench` every ``testbenches/tb/tb_*.py`` is written against.

Payloads are packed and unpacked through the same ``amaranth.lib.data`` layouts the RTL
uses. Sources insert random idle cycles between items (valid never depends on ready and,
once raised, is held until the transfer); sinks drop ready at random (back-pressure);
memories answer a request stream on a response stream after a random latency. Every
transfer is recorded with its cycle number.

A bench is its stimulus and its golden function::

    bench = await Bench.start(dut, VpuConfig)          # clock, reset, config, seed, params
    src, sink = bench.source("i", in_layout), bench.sink("o", out_layout)
    for x in stimulus(bench.cfg, bench.rng, bench.vectors(1000)):
        src.put(x)
        sink.expect(golden(x), inputs=x)                # the scoreboard's next item on "o"
    await bench.drain(timeout_cycles=...)               # every expectation received, compared
    bench.finish(vectors=..., nonzero_outputs=...)      # report written; fails on a mismatch
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
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge


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


def split_beats(vec, lanes: int) -> list[list[int]]:
    """A vector (list or 1-D tensor) as its transfers of ``lanes`` elements."""
    vec = [int(x) for x in vec]
    return [vec[b:b + lanes] for b in range(0, len(vec), lanes)]


class Cycles:
    """Counts rising edges; read ``.now`` in the ReadOnly phase."""

    def __init__(self, clk):
        self.clk, self.now = clk, 0
        cocotb.start_soon(self._count())

    async def _count(self):
        while True:
            await RisingEdge(self.clk)
            self.now += 1


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


# -- stream ports --------------------------------------------------------------------------
class _StreamPort:
    """One ``<prefix>__valid/ready/payload`` port: every rising edge ``_drive`` sets this side's
    handshake signal, then in the ReadOnly phase ``_sample`` returns the item transferred in
    this cycle (or None), which is logged as ``(cycle, item)``. An always-ready stream has no
    ``__ready`` wire (``ready`` is None: every valid item is taken)."""

    def __init__(self, dut, prefix, shape, cycles: Cycles, rng: random.Random):
        self.name = prefix
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready", None)
        self.payload = getattr(dut, f"{prefix}__payload")
        self.shape, self.cycles, self.rng = shape, cycles, rng
        self.log: list[tuple[int, object]] = []
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.cycles.clk)
            self._drive()
            await ReadOnly()
            item = self._sample()
            if item is not None:
                self.log.append((self.cycles.now, item))

    @property
    def items(self) -> list:
        """The transferred items, in order (without their cycles)."""
        return [item for _, item in self.log]

    async def wait_for(self, count: int, timeout_cycles: int):
        """Wait until ``count`` items have been transferred."""
        start = self.cycles.now
        while len(self.log) < count:
            await RisingEdge(self.cycles.clk)
            if self.cycles.now - start > timeout_cycles:
                raise AssertionError(
                    f"timeout on {self.name}: {len(self.log)}/{count} items after {timeout_cycles} cycles")


class StreamSource(_StreamPort):
    """Sends queued items with random idle gaps (probability ``gap`` per cycle). When ``valid``
    drops, the payload becomes random bits (a block must not use it without ``valid``: the
    SRAM's write enable ORed with its valid wrote them and survived a bench that left the
    last item on the payload); drawn from a generator of its own, so the bench's stream of
    random choices is the same with or without it."""

    _current = None
    _held = False                     # valid was high in the last cycle

    def __init__(self, dut, prefix, shape, cycles: Cycles, rng: random.Random, gap: float = 0.3):
        self.gap = gap
        self.queue: deque = deque()
        self.width = Shape.cast(shape).width
        self.noise = random.Random(f"{prefix}:{sum(rng.getstate()[1])}")
        super().__init__(dut, prefix, shape, cycles, rng)
        self.valid.value = 0

    def put(self, *items) -> None:
        self.queue.extend(items)

    @property
    def sent(self) -> list[tuple[int, object]]:
        return self.log

    @property
    def idle(self) -> bool:
        return not self.queue and self._current is None

    def _drive(self):
        if self._current is None and self.queue and self.rng.random() >= self.gap:
            self._current = self.queue.popleft()
            self.payload.value = pack(self.shape, self._current)
            self.valid.value = 1
        elif self._current is None and self._held:
            self.valid.value = 0
            self.payload.value = self.noise.getrandbits(self.width)
        self._held = self._current is not None

    def _sample(self):
        item = self._current
        if item is not None and (self.ready is None or int(self.ready.value)):
            self._current = None
            return item
        return None


class StreamSink(_StreamPort):
    """Takes items with random back-pressure (ready low with probability ``stall`` per cycle;
    with ``hold``, each stall drawn lasts 1 to ``hold`` cycles: long stretches that fill what
    the block keeps for its output; an always-ready stream, which has no ``ready`` wire, takes
    every valid item). ``expect`` queues the golden items the bench's scoreboard
    compares with what arrives."""

    def __init__(self, dut, prefix, shape, cycles: Cycles, rng: random.Random, stall: float = 0.3, hold: int = 1):
        self.stall, self.hold, self._stalled_for = stall, hold, 0
        self._ready = False
        self.expected: list[tuple[object, object]] = []   # (golden item, its inputs)
        super().__init__(dut, prefix, shape, cycles, rng)
        if self.ready is None:
            self.stall = 0.0
        else:
            self.ready.value = 0

    @property
    def received(self) -> list[tuple[int, object]]:
        return self.log

    def expect(self, item, inputs=None) -> None:
        """The next golden item on this port; ``inputs`` names its stimulus in a mismatch."""
        self.expected.append((item, inputs))

    def _drive(self):
        if self._stalled_for:
            self._stalled_for -= 1
        else:
            self._ready = self.rng.random() >= self.stall
            if not self._ready and self.hold > 1:
                self._stalled_for = self.rng.randrange(self.hold)
        if self.ready is not None:
            self.ready.value = int(self._ready)

    def _sample(self):
        if self._ready and int(self.valid.value):
            value = self.payload.value   # a 1-bit payload reads as a Logic, which has no to_unsigned
            return unpack(self.shape, value.to_unsigned() if hasattr(value, "to_unsigned") else int(value))
        return None


class StreamMemory:
    """A memory model behind a request/response stream pair: random back-pressure on
    requests, in-order responses after a random latency, random gaps on responses.
    ``lookup(request) -> response item`` gives the data; with ``burst``, ``lookup(request) ->
    list of response items`` (possibly empty: a write), sent in order."""

    def __init__(self, dut, req_prefix, req_shape, resp_prefix, resp_shape, cycles: Cycles, rng, lookup,
                 latency=(1, 8), stall: float = 0.2, gap: float = 0.2, burst: bool = False):
        self.requests = StreamSink(dut, req_prefix, req_shape, cycles, rng, stall=stall)
        self.responses = StreamSource(dut, resp_prefix, resp_shape, cycles, rng, gap=gap)
        self.cycles, self.rng, self.latency = cycles, rng, latency
        self.lookup = lookup if burst else (lambda request: [lookup(request)])
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
                self.responses.put(*self.lookup(self._pending.popleft()[1]))


def kv_lookup(k, v, lanes: int):
    """``lookup`` of a KV main memory: request ``{value, position, beat}`` -> that beat of row
    ``position`` of ``v`` (value 1) or ``k`` (value 0)."""
    def lookup(req):
        table = v if req["value"] else k
        return table[req["position"], req["beat"] * lanes:(req["beat"] + 1) * lanes].tolist()
    return lookup


# -- the run's context and scoreboard -------------------------------------------------------
class Context:
    """Config, seed, parameters and report of one simulation run (set by testbenches/runner.py)."""

    def __init__(self, config_class):
        self.cfg = config_class.from_json(os.environ["LADMAC_CONFIG"])
        self.seed = int(os.environ["LADMAC_SEED"])
        self.params = json.loads(os.environ.get("LADMAC_PARAMS", "{}"))
        self.rng = random.Random(self.seed)
        self.report: dict = {"seed": self.seed, "config": self.cfg.to_dict()}

    def write_report(self) -> None:
        with open(os.environ["LADMAC_REPORT"], "w") as f:
            json.dump(self.report, f, indent=1)


class Scoreboard:
    """Compares DUT items with golden ones, counts them and keeps the first ``keep`` mismatches
    (with the inputs that produced them). Dict items compare on the golden item's keys only
    (a golden record names the fields it checks)."""

    def __init__(self, keep: int = 20):
        self.keep = keep
        self.checked = 0
        self.count = 0
        self.first: list[str] = []

    def fail(self, message: str) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(message)

    def check(self, what: str, got, want, inputs=None) -> bool:
        """One item; True if it matches."""
        self.checked += 1
        if isinstance(want, dict) and isinstance(got, dict):
            got = {key: got.get(key) for key in want}
        if got == want:
            return True
        if isinstance(want, dict):
            got, want = ({key: x[key] for key in want if got[key] != want[key]} for x in (got, want))
        self.fail(f"{what}: rtl {got} golden {want}" + ("" if inputs is None else f" (inputs {inputs})"))
        return False

    def compare(self, what: str, got: list, want: list, inputs: list | None = None) -> None:
        """Two item sequences, item by item, then their lengths."""
        for j, (g, w) in enumerate(zip(got, want)):
            self.check(f"{what} #{j}", g, w, None if inputs is None else inputs[j])
        if len(got) != len(want):
            self.fail(f"{what} count: rtl {len(got)} golden {len(want)}")


class Bench:
    """One cocotb run against a block: its :class:`Context` (``cfg``, ``seed``, ``rng``,
    ``params``, ``report``), clock and reset, the cycle counter, stream ports with the run's
    gap / stall / latency parameters, and a :class:`Scoreboard`. Create with ``await Bench.start``."""

    def __init__(self, dut, config_class):
        self.dut = dut
        self.ctx = Context(config_class)
        self.cfg, self.seed, self.rng = self.ctx.cfg, self.ctx.seed, self.ctx.rng
        self.params, self.report = self.ctx.params, self.ctx.report
        self.gap = self.params.get("gap", 0.3)
        self.stall = self.params.get("stall", 0.3)
        self.scoreboard = Scoreboard()
        self.sinks: list[StreamSink] = []
        self.cycles: Cycles | None = None

    @classmethod
    async def start(cls, dut, config_class, period_ns: int = 10) -> "Bench":
        """Read the run's context, start the clock, hold reset for two cycles."""
        bench = cls(dut, config_class)
        Clock(dut.clk, period_ns, unit="ns").start()
        dut.rst.value = 1
        for _ in range(2):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        bench.cycles = Cycles(dut.clk)
        return bench

    # -- parameters
    def vectors(self, default: int) -> int:
        """``params["vectors"]``: how many random transactions to generate."""
        return self.params.get("vectors", default)

    def steps(self, default: int) -> int:
        """``params["steps"]``: how many steps a step-based bench runs."""
        return self.params.get("steps", default)

    # -- ports
    def source(self, prefix, shape, gap: float | None = None) -> StreamSource:
        return StreamSource(self.dut, prefix, shape, self.cycles, self.rng, gap=self.gap if gap is None else gap)

    def sink(self, prefix, shape, stall: float | None = None, hold: int = 1) -> StreamSink:
        sink = StreamSink(self.dut, prefix, shape, self.cycles, self.rng, stall=self.stall if stall is None else stall,
                          hold=hold)
        self.sinks.append(sink)
        return sink

    def memory(self, req_prefix, req_shape, resp_prefix, resp_shape, lookup, latency=(1, 8),
               burst: bool = False) -> StreamMemory:
        """A request/response memory; ``params["latency"]`` overrides ``latency``, the run's
        stall and gap apply to its request and response streams (``burst``: see StreamMemory)."""
        return StreamMemory(self.dut, req_prefix, req_shape, resp_prefix, resp_shape, self.cycles, self.rng, lookup,
                            latency=tuple(self.params.get("latency", latency)), stall=self.stall, gap=self.gap,
                            burst=burst)

    # -- waiting and checking
    async def until(self, condition, timeout_cycles: int, what: str = "condition") -> None:
        await wait_until(self.cycles, condition, timeout_cycles, what)

    async def settle(self, cycles: int) -> None:
        await ClockCycles(self.dut.clk, cycles)

    def check(self, what: str, got, want, inputs=None) -> bool:
        return self.scoreboard.check(what, got, want, inputs)

    def compare(self, what: str, got: list, want: list, inputs: list | None = None) -> None:
        self.scoreboard.compare(what, got, want, inputs)

    async def drain(self, timeout_cycles: int, settle: int = 20) -> None:
        """Wait until every sink has received its expected items, let ``settle`` more cycles
        pass (an extra item is a mismatch too), then compare each sink with its expectations."""
        for sink in self.sinks:
            if sink.expected:
                await sink.wait_for(len(sink.expected), timeout_cycles)
        await self.settle(settle)
        for sink in self.sinks:
            if sink.expected:
                want, inputs = zip(*sink.expected)
                self.compare(sink.name, sink.items, list(want), list(inputs))

    @property
    def mismatches(self) -> list[str]:
        return self.scoreboard.first

    def finish(self, vectors: int, **fields) -> None:
        """Write the report (``vectors``, ``mismatches``, the first ones as ``mismatch_list``,
        ``cycles`` since reset, and the bench's own ``fields``); fail on any mismatch."""
        board = self.scoreboard
        self.report.update(vectors=vectors, mismatches=board.count, mismatch_list=board.first,
                           checked=board.checked, cycles=self.cycles.now)
        self.report.update(fields)
        self.ctx.write_report()
        assert not board.count, f"seed {self.seed}: {board.count} mismatches, first: {board.first[:3]}"
