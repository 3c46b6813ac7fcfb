"""Formal stream properties (testbenches/formal/, docs/verification.md) at the small configs:
SymbiYosys + Yices prove or bound them, find every cover, and catch deliberately broken
handshakes. The larger configs and the LAD / dense blocks run in ``make formal``."""
from __future__ import annotations

import pytest

from testbenches.formal.harness import Mutation
from testbenches.formal.sby import run
from testbenches.formal.specs import SPECS

# The blocks checked in `make test` (the rest: `make formal`, docs/verification.md).
QUICK = ["vpu", "sfm", "sram", "mac-match", "mac-merge"]


def _ok(result):
    assert result.status == "PASS" and not result.failed, result.line() + "\n" + result.log_tail


@pytest.mark.parametrize("block", QUICK)
def test_protocol_k_induction(block):
    """Output streams hold valid and payload until ready: proved for all time by k-induction."""
    result = run(block, mode="prove")
    _ok(result)
    assert any(p.endswith("valid_held") for p in result.properties)


@pytest.mark.parametrize("block", QUICK)
def test_counting_bmc(block):
    """No output unit before the input that causes it, bounded buffering (plus the protocol)."""
    result = run(block, mode="bmc")
    _ok(result)
    assert any("<=" in p for p in result.properties)


@pytest.mark.parametrize("block", QUICK)
def test_liveness_bmc(block):
    """With outputs ready, an offered input is taken within the bound (BMC deeper than it)."""
    result = run(block, mode="live")
    _ok(result)
    bounds = [lv.bound for lv in SPECS[block].rules(SPECS[block].small)["lives"]]
    assert result.depth > max(bounds)


@pytest.mark.parametrize("block", QUICK)
def test_covers_reached(block):
    """Every cover (a stall held then taken, an output unit, the buffering bound, an input
    taken after waiting) has a trace: the properties above are not vacuous."""
    result = run(block, mode="cover")
    _ok(result)
    assert result.reached and not result.unreached


@pytest.mark.parametrize("kind,prop", [("drop_valid", "o.valid_held"), ("payload", "o.payload_stable")])
def test_broken_handshake_is_caught(kind, prop):
    """A VPU whose output drops valid in a stall, or changes its payload while stalled, fails
    the protocol check with a counterexample naming the property."""
    result = run("vpu", mode="prove", depth=10, mutation=Mutation("o", kind))   # the base case finds it
    assert result.status == "FAIL", result.line()
    assert result.failed == [prop], result.line()
    assert result.trace is not None and result.trace.exists()


def test_decode_engine_bmc():
    """The MAC decode engine at its tiny config: protocol, counting (``out<=query``: d/L + 1
    beats per step) and its requests only inside a step, with the KV and entry-store responses
    counted from what each request asks for (a burst's count x d/L beats, none for a write)."""
    result = run("mac-decode", mode="bmc")
    _ok(result)
    assert {"assert:out<=query", "assert:kv_req.only_in_step", "assert:es_req.only_in_step"} <= set(result.properties)


def test_cover_trace_replays_on_the_design():
    """The replay that makes a cut model's covers count (replay.py): a cover trace of the VPU
    (no cut cells: the solver's model is the design) replayed in Amaranth's simulator reaches
    its cover in the step the solver reports, and with the input never valid it reaches none."""
    from testbenches.formal.replay import replay
    from testbenches.formal.sby import wrapper
    result = run("vpu", mode="cover")
    _ok(result)
    assert result.traces and set(result.traces) == set(result.reached), result.line()
    top = lambda: wrapper("vpu", SPECS["vpu"].small, "cover", replay=True)
    for cover, trace in result.traces.items():
        assert replay(top(), trace, cover).hit == result.reached_at[cover], cover
    unit = "o.unit_done"
    starved = replay(top(), result.traces[unit], unit, force={"i__valid": 0})
    assert starved.hit is None and starved.left_env is None


def test_prefix_continuation_starts_in_the_simulated_state(tmp_path):
    """The solver's first state is the simulated run's last: the LAD tile's continuation after 100
    cycles (registers, memory rows and synchronous read ports' outputs carried over), driven with
    the inputs of the run's next 20 cycles, gives the run's outputs in each of them (yosys-smtbmc:
    the inputs assumed, every output port asserted equal). It fails with the memory rows, the read
    ports' outputs or the registers left out (mac-decode's run reads no memory within 24 cycles of
    its prefix, so the tile it is)."""
    from hdl.lib.verilog import top_ports
    from testbenches.formal.prefix import continuation, simulate, smtc
    from testbenches.formal.sby import _status, solve, wrapper
    block = "lad-tile"
    spec = SPECS[block]
    cfg, cycles, more = spec.small, 100, 20
    longer = simulate(wrapper(block, cfg, "prefix", replay=True), spec.rules(cfg), cycles + more)
    top = wrapper(block, cfg, "prefix", replay=True)
    text = continuation(top, simulate(top, spec.rules(cfg), cycles), top_ports(top))
    widths = {name: len(value) for name, (value, _) in top_ports(top).items()}
    outputs = {name: values[cycles:] for name, values in longer.outputs.items()}
    assert any(any(v) for name, v in outputs.items() if name.endswith("payload"))   # non-trivial
    log = solve(tmp_path, text, "bmc", more, timeout=600,
                smtc=smtc({name: values[cycles:] for name, values in longer.inputs.items()}, widths, outputs))
    assert _status(log) == "PASS", log[-2000:]


def test_prefix_continues_the_simulated_run():
    """A prefixed task (prefix.py: the solver starts in the state a simulated run ends in)
    continues the run: mac-match's covers with a 12-cycle prefix are all reached, and each trace
    the solver wrote, replayed on the design from reset after the run's inputs, reaches its cover
    in the cycle the task reports (the cycles line up; that the state carries over whole is the
    test above's); a VPU whose output drops valid in a stall fails, with the
    stall inside the prefix (10 cycles), after it (2 cycles), and with no solver steps at all
    (depth 12 within a 12-cycle prefix: the simulation's check alone)."""
    from testbenches.formal.prefix import simulate
    from testbenches.formal.replay import replay
    from testbenches.formal.sby import wrapper
    from testbenches.formal.specs import Prefix
    prefix, spec = Prefix(12, seed=3), SPECS["mac-match"]
    result = run("mac-match", mode="cover", depth=24, prefix=prefix)
    _ok(result)
    assert result.reached and not result.unreached and result.prefix == prefix
    simulated = simulate(wrapper("mac-match", spec.small, "cover", replay=True), spec.rules(spec.small),
                         prefix.cycles, prefix.seed)
    inputs = simulated.inputs
    assert any(inputs["query__valid"]) and not all(inputs["result__ready"])   # offered, and stalled
    assert simulated.memories and simulated.read_data   # the run's state has both kinds
    after = {cover: trace for cover, trace in result.traces.items() if cover not in simulated.covers}
    assert after   # covers only the solver reached, after the run
    for cover, trace in after.items():
        assert result.reached_at[cover] >= prefix.cycles, cover
        again = replay(wrapper("mac-match", spec.small, "cover", replay=True), trace, cover, before=inputs)
        assert again.left_env is None and again.hit == result.reached_at[cover], (cover, again)
    for cycles, depth in ((10, 16), (2, 16), (12, 12)):   # inside the prefix, after it, the simulation alone
        broken = run("vpu", mode="prefix", depth=depth, prefix=Prefix(cycles), mutation=Mutation("o", "drop_valid"))
        assert broken.status == "FAIL" and broken.failed == ["o.valid_held"], broken.line()
        assert broken.solver == (depth > cycles) and (broken.step < cycles) == (cycles > 2), broken.line()
