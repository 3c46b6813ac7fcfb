"""The formal wrapper: a block at a small config, every stream port under protocol properties.

:class:`FormalWrapper` has the block's own signature (its ports become the free inputs and
the outputs of the formal model) and adds, in Amaranth (``Assert`` / ``Assume`` / ``Cover``):

- **protocol assumptions** on every input stream: once ``valid`` is high it stays high, with
  the payload unchanged, until the transfer (``ready``);
- **protocol assertions** on every output stream: the same rule, which the block must keep;
- the **environment** of request/response pairs (:class:`Response`): a response only while a
  request is outstanding (a memory or an SFM does not answer what was not asked);
- **counting rules** (:class:`Count`): an output unit starts only after the input units that
  cause it, and no more than ``cap`` units are buffered inside (:class:`Gate`: a request port
  is valid only while a step is in flight);
- **bounded liveness** (``mode="live"``, :class:`Live`): with every output ready and every
  response answered at once, an offered input is taken within ``bound`` cycles;
- **covers** that show each of the above is reachable (a stall that is held and then taken,
  an output unit, an input accepted after waiting).

Reset is assumed low (the model starts in the reset state: Amaranth's register inits). Each
property's ``src_loc`` is set to its name, so SymbiYosys reports it by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth import Module, Mux, Signal, ResetSignal, Value
from amaranth.hdl import Assert, Assume, Cover
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import Flow


@dataclass(frozen=True)
class Count:
    """``out`` units never start before the ``inp`` units that cause them:
    ``ceil(out_beats / out_per) <= floor(in_beats / in_per)`` (in_beats counts only transfers
    whose payload passes ``in_when``), and at most ``cap`` units are taken but not yet
    fully emitted (``None``: no bound asserted). ``cap`` is an upper bound chosen above the
    block's pipeline depth (which changes with retiming): it catches lost back-pressure."""
    out: str
    inp: str
    in_per: int = 1
    out_per: int = 1
    cap: int | None = None
    in_when: object = None   # payload -> Value (a filter on the input transfers), or None


@dataclass(frozen=True)
class Gate:
    """``out.valid`` only while a step is in flight: at least one ``inp`` beat taken more than
    ``done`` has finished (``done`` a :class:`Count` whose out units end a step)."""
    out: str
    inp: str
    done: str
    in_per: int = 1
    done_per: int = 1


@dataclass(frozen=True)
class Response:
    """Environment: ``resp`` answers ``req``, ``per`` response transfers per request transfer
    (an int, or payload -> Value for a request that says how many: a burst's count, none for
    a write)."""
    req: str
    resp: str
    per: object = 1


@dataclass(frozen=True)
class Live:
    """Bounded liveness of input ``inp``: offered (valid) it is taken within ``bound`` cycles
    when every output is ready and every response comes at once."""
    inp: str
    bound: int


@dataclass
class Mutation:
    """A deliberately broken handshake on output ``port`` (for the checks that must fail):
    ``drop_valid`` lowers valid in the second cycle of a stall, ``payload`` flips the payload's
    low bit while the output is stalled."""
    port: str
    kind: str


def stream_ports(component) -> dict[str, Flow]:
    """Every stream member of ``component``'s signature with a handshake: name -> In or Out; an
    array of streams (one per query head of a KV group: APID's ``cand``) as ``name[0]``,
    ``name[1]``, ... (see :func:`port`). An always-ready stream (the LAD modules' ``q_load`` /
    ``k_load``) has none: every beat is taken, so holding and stalling cannot happen (its stall
    cover would be unreachable)."""
    out = {}
    for name, member in component.signature.members.items():
        if (member.is_signature and isinstance(member.signature, stream.Signature)
                and not member.signature.always_ready):
            assert len(member.dimensions) <= 1, f"{name}: arrays of more than one dimension"
            for i in range(member.dimensions[0]) if member.dimensions else [None]:
                out[name if i is None else f"{name}[{i}]"] = member.flow
    return out


def port(obj, name: str):
    """The stream ``name`` of ``obj`` (a component or the wrapper): ``cand[1]`` is ``obj.cand[1]``."""
    base, _, index = name.partition("[")
    s = getattr(obj, base)
    return s[int(index[:-1])] if index else s


def ident(name: str) -> str:
    """``name`` as part of a signal's or property's name (``cand[1]`` -> ``cand1``)."""
    return name.replace("[", "").replace("]", "")


def _named(prop, name: str):
    prop.src_loc = (name, 0)
    return prop


class FormalWrapper(wiring.Component):
    """``dut`` with its stream ports under protocol properties (see the module docstring).

    ``mode``: ``"prove"`` (protocol assertions only, for k-induction), ``"bmc"`` (protocol,
    counting and gate assertions), ``"deep"`` (as bmc without the payload assertions: for a
    model whose datapath cells are cut to free values, where a payload computed through them
    is no longer a function of held state), ``"live"`` (liveness assertions with the live
    environment), ``"cover"`` (covers only, no assertions)."""

    def __init__(self, dut, *, mode: str, counts=(), gates=(), responses=(), lives=(), assumes=(),
                 mutation: Mutation | None = None, replay: bool = False):
        assert mode in ("prove", "bmc", "deep", "live", "cover"), mode
        self.dut, self.mode, self.mutation = dut, mode, mutation
        # replay: every property's test drives a signal of ``tests`` (name -> (kind, signal))
        # instead of an Assert / Assume / Cover, for Amaranth's simulator (see replay.py)
        self.replay, self.tests = replay, {}
        self.counts, self.gates, self.responses, self.lives = list(counts), list(gates), list(responses), list(lives)
        self.assumes = list(assumes)   # wrapper -> Value: the block's input contract (e.g. a length >= 1)
        self.ports = stream_ports(dut)
        for rule in self.counts + self.gates:
            for name in (rule.out, rule.inp):
                assert name in self.ports, f"{type(dut).__name__} has no stream port '{name}'"
        super().__init__(dut.signature)
        self.property_names: list[str] = []

    # -- helpers
    def _prop(self, m, kind, test, name, listed=True):
        if listed:
            self.property_names.append(f"{kind.__name__.lower()}:{name}")
        if self.replay:
            signal = Signal(name=f"test_{len(self.tests)}")
            m.d.comb += signal.eq(test)
            self.tests[name] = (kind.__name__.lower(), signal)
        else:
            m.d.comb += _named(kind(test), name)

    def tests_of(self, kind: str) -> list:
        """``(name, signal)`` of the replay tests of ``kind`` ("assume", "assert" or "cover");
        they exist once the wrapper is elaborated (a Simulator of it is made)."""
        return [(name, signal) for name, (k, signal) in self.tests.items() if k == kind]

    def _assume(self, m, test, name):
        """The environment (unlisted; named for a replay that leaves it)."""
        self._prop(m, Assume, test, name, listed=False)

    def _counter(self, m, name, width=8):
        return Signal(range(1 << width), name=name)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        mode = self.mode
        # Connect everything but a mutated output straight through.
        mutated = self.mutation.port if self.mutation else None
        for name, member in dut.signature.members.items():
            outer, inner = getattr(self, name), getattr(dut, name)
            if name == mutated:
                continue
            if member.is_signature:
                for o, i in zip(outer, inner) if member.dimensions else [(outer, inner)]:
                    wiring.connect(m, wiring.flipped(o), i)
            elif member.flow == Flow.In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        if mutated:
            self._mutate(m, getattr(self, mutated), getattr(dut, mutated))

        started = Signal()   # low in the first (reset) cycle: no past yet
        m.d.sync += started.eq(1)
        self._assume(m, ~ResetSignal(), "no_reset")
        for k, contract in enumerate(self.assumes):
            self._assume(m, contract(self), f"contract{k}")

        def transfer(name):
            s = port(self, name)
            return s.valid & s.ready

        # Protocol: held valid and stable payload until ready, assumed on inputs, asserted on outputs.
        for name, flow in self.ports.items():
            s = port(self, name)
            held = Signal(name=f"{ident(name)}_held")
            payload_bits = Value.cast(s.payload).as_unsigned()   # signed payloads compare as bits
            prev = Signal(len(payload_bits), name=f"{ident(name)}_prev")
            m.d.sync += [held.eq(s.valid & ~s.ready), prev.eq(payload_bits)]
            valid_kept = ~(started & held) | s.valid
            payload_kept = ~(started & held) | (payload_bits == prev)
            if flow == Flow.In:
                self._assume(m, valid_kept, f"{name}.valid_held")
                self._assume(m, payload_kept, f"{name}.payload_stable")
            elif mode in ("prove", "bmc", "deep"):
                self._prop(m, Assert, valid_kept, f"{name}.valid_held")
                if mode != "deep":
                    self._prop(m, Assert, payload_kept, f"{name}.payload_stable")
            elif mode == "cover":
                self._prop(m, Cover, started & held & s.valid & s.ready, f"{name}.stall_then_transfer")

        # Environment: responses only while requests are outstanding.
        outstanding = {}
        for r in self.responses:
            n = Signal(range(-256, 256), name=f"{ident(r.resp)}_outstanding")
            per = r.per(port(self, r.req).payload) if callable(r.per) else r.per
            m.d.sync += n.eq(n + Mux(transfer(r.req), per, 0) - transfer(r.resp))   # no $mul: cut cells are the dut's
            outstanding[r.resp] = n
            self._assume(m, ~port(self, r.resp).valid | (n > 0), f"{r.resp}.only_when_asked")

        # Counting rules.
        def units(stream_name, per, when=None, name=""):
            """(units completed, beat index in the unit, beat now) of ``stream_name``'s transfers."""
            s = port(self, stream_name)
            beat_now = transfer(stream_name) if when is None else transfer(stream_name) & when(s.payload)
            beat = Signal(range(max(per, 2)), name=f"{name}_beat")
            done = Signal(range(256), name=f"{name}_units")
            with m.If(beat_now):
                with m.If(beat == per - 1):
                    m.d.sync += [beat.eq(0), done.eq(done + 1)]
                with m.Else():
                    m.d.sync += beat.eq(beat + 1)
            return done, beat, beat_now

        for k, c in enumerate(self.counts):
            tag = f"count{k}_{ident(c.out)}_{ident(c.inp)}"
            in_done, in_beat, in_now = units(c.inp, c.in_per, c.in_when, f"{tag}_in")
            out_done, out_beat, out_now = units(c.out, c.out_per, None, f"{tag}_out")
            # input units finished, this cycle's transfer included (a block may pass through)
            in_now_done = in_done + (in_now & (in_beat == c.in_per - 1))
            # an output beat (first of its unit or not) belongs to unit out_done + 1
            ok = ~out_now | (in_now_done > out_done)
            if mode in ("bmc", "deep"):
                self._prop(m, Assert, ok, f"{c.out}<={c.inp}")
                if c.cap is not None:
                    self._prop(m, Assert, in_done <= out_done + c.cap, f"{c.inp}-{c.out}<={c.cap}")
            elif mode == "cover":
                self._prop(m, Cover, out_now & (out_beat == c.out_per - 1), f"{c.out}.unit_done")
                if c.cap is not None:   # buffering is reached (up to 2 units; the bound may be loose)
                    least = min(c.cap, 2)
                    self._prop(m, Cover, in_done >= out_done + least, f"{c.inp}-{c.out}>={least}")

        for k, g in enumerate(self.gates):
            tag = f"gate{k}_{ident(g.out)}"
            in_done, in_beat, in_now = units(g.inp, g.in_per, None, f"{tag}_in")
            done, _, _ = units(g.done, g.done_per, None, f"{tag}_done")
            in_flight = (in_done + ((in_beat != 0) | in_now)) > done   # a step begun, not finished
            if mode in ("bmc", "deep"):
                self._prop(m, Assert, ~port(self, g.out).valid | in_flight, f"{g.out}.only_in_step")
            elif mode == "cover":
                self._prop(m, Cover, port(self, g.out).valid & in_flight, f"{g.out}.in_step")

        # Bounded liveness.
        if mode in ("live", "cover"):
            if mode == "live":
                for name, flow in self.ports.items():
                    s = port(self, name)
                    if flow == Flow.Out:
                        self._assume(m, s.ready, f"{name}.always_ready")
                    elif name in outstanding:
                        self._assume(m, s.valid == (outstanding[name] > 0), f"{name}.answered_at_once")
            for lv in self.lives:
                s = port(self, lv.inp)
                wait = Signal(range(lv.bound + 2), name=f"{ident(lv.inp)}_wait")
                with m.If(s.valid & ~s.ready):
                    m.d.sync += wait.eq(wait + 1)
                with m.Else():
                    m.d.sync += wait.eq(0)
                if mode == "live":
                    self._prop(m, Assert, wait < lv.bound, f"{lv.inp}.taken_within_{lv.bound}")
                else:
                    self._prop(m, Cover, s.valid & s.ready, f"{lv.inp}.taken")
                    if lv.bound > 1:   # bound 1: never waits while outputs are ready
                        self._prop(m, Cover, (wait > 0) & s.valid & s.ready, f"{lv.inp}.taken_after_wait")
        return m

    def _mutate(self, m, outer, inner):
        """Pass ``inner`` (the dut's output stream) to ``outer`` with a broken handshake."""
        stalled = Signal(name="mutation_stalled")
        m.d.sync += stalled.eq(outer.valid & ~outer.ready)
        m.d.comb += inner.ready.eq(outer.ready)
        if self.mutation.kind == "drop_valid":
            m.d.comb += [outer.valid.eq(inner.valid & ~stalled), outer.payload.eq(inner.payload)]
        elif self.mutation.kind == "payload":
            m.d.comb += [outer.valid.eq(inner.valid),
                         Value.cast(outer.payload).eq(Value.cast(inner.payload) ^ stalled)]
        else:
            raise ValueError(f"unknown mutation '{self.mutation.kind}'")
