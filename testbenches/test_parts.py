"""hdl.lib.parts: a parent's parts converted apart, linted apart, and failures reported."""
import pytest
from amaranth import Module, Signal, unsigned
from amaranth.hdl import Fragment
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.lib.parts import add_part, collecting, convert_parts, port_stub
from hdl.lib.slice import RegisterSlice
from hdl.lib.verilog import lint_verilog, to_verilog


class TwoSlices(wiring.Component):
    """Two register slices in series, each a part (``broken``: the second fails to elaborate)."""
    i: In(stream.Signature(unsigned(12)))
    o: Out(stream.Signature(unsigned(12)))

    def __init__(self, broken=False):
        super().__init__()
        self.broken = broken

    def elaborate(self, platform):
        m = Module()
        first, second = RegisterSlice(unsigned(12)), RegisterSlice(unsigned(12))
        if self.broken:
            second.elaborate = lambda platform: 1 / 0
        add_part(m, "first", first)
        add_part(m, "second", second)
        wiring.connect(m, wiring.flipped(self.i), first.i)
        wiring.connect(m, first.o, second.i)
        wiring.connect(m, second.o, wiring.flipped(self.o))
        return m


class Stage(RegisterSlice):
    """A register slice with a config (its width): parts of one module are one class at one config."""
    def __init__(self, width: int):
        super().__init__(unsigned(width))
        self.cfg = width


class TwoStages(wiring.Component):
    """Two equal register slices in series, both instances of the module ``stage``."""
    i: In(stream.Signature(unsigned(12)))
    o: Out(stream.Signature(unsigned(12)))

    def elaborate(self, platform):
        m = Module()
        first, second = Stage(12), Stage(12)
        add_part(m, "stage", first, module="stage")
        add_part(m, "stage1", second, module="stage")
        wiring.connect(m, wiring.flipped(self.i), first.i)
        wiring.connect(m, first.o, second.i)
        wiring.connect(m, second.o, wiring.flipped(self.o))
        return m


def test_parts_of_one_module_are_converted_once(tmp_path):
    """A KV group's per-head MDs and ACs: one module, an instance per head; another config under
    the same module, or a part's name taken twice, is refused."""
    with collecting() as parts:
        text = to_verilog(TwoStages(), "top")
    assert list(parts) == ["stage"] and "stage stage (" in text and "stage stage1 (" in text
    modules = convert_parts(parts, lint=True, jobs=2)
    assert len(modules) == 1 and modules[0].count("module ") == 1
    whole = tmp_path / "top.v"
    whole.write_text(text + "".join(modules))
    lint_verilog(whole)
    with collecting():
        m = Module()
        add_part(m, "a", Stage(12), module="s")
        with pytest.raises(ValueError, match="module 's' is already another part's"):
            add_part(m, "b", Stage(8), module="s")
        with pytest.raises(ValueError, match="module 's' is already another part's"):
            add_part(m, "s", Stage(12))


def test_parts_are_instances_only_while_collecting(tmp_path):
    m = Module()
    add_part(m, "slice", RegisterSlice(unsigned(4)))
    assert isinstance(m.submodules["slice"], RegisterSlice)   # an ordinary submodule
    Fragment.get(m, None)
    with collecting() as parts:
        text = to_verilog(TwoSlices(), "top")
    assert list(parts) == ["first", "second"]
    assert "first first (" in text and "second second (" in text and "module first" not in text
    modules = convert_parts(parts, lint=True, jobs=2)
    assert [t.count("module ") for t in modules] == [1, 1]
    assert "module first(" in modules[0] and "module second(" in modules[1]
    whole = tmp_path / "top.v"
    whole.write_text(text + "".join(modules))
    lint_verilog(whole)                                   # the assembled design is one clean design
    stubbed = tmp_path / "stubbed.v"
    stubbed.write_text(text + "".join(port_stub(name, c) for name, c in parts.items()))
    lint_verilog(stubbed)


def test_a_port_missing_from_a_stub_fails_lint(tmp_path):
    with collecting() as parts:
        text = to_verilog(TwoSlices(), "top")
    stubs = "".join(port_stub(name, c) for name, c in parts.items())
    bad = tmp_path / "bad.v"
    bad.write_text(text + stubs.replace("[11:0] i__payload", "[11:0] i__payloat", 1))
    with pytest.raises(RuntimeError, match="lint-only rejected"):
        lint_verilog(bad)


def test_a_failing_part_raises_with_its_traceback():
    with collecting() as parts:
        to_verilog(TwoSlices(broken=True), "top")
    with pytest.raises(RuntimeError, match="converting part 'second' failed:(.|\n)*ZeroDivisionError"):
        convert_parts(parts, jobs=2)


def test_a_module_whose_ports_differ_from_its_instance_is_refused():
    from hdl.lib.parts import _check_header
    part = RegisterSlice(unsigned(12))
    good = to_verilog(part, "first")
    _check_header("first", part, good)
    with pytest.raises(RuntimeError, match=r"missing \['o__ready'\]"):
        _check_header("first", part, good.replace("o__ready", "o__readz", 1))
