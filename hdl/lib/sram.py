"""SRAM bank: an ``amaranth.lib.memory.Memory`` behind stream ports.

One write stream (always ready) and ``read_ports`` request/response stream pairs. Each
read port is a ``read_latency``-stage pipeline that stalls as a whole when its response
is not taken (the memory's read enable is held low, so the word is kept). Reads are
not transparent: a read and a write to the same word in one cycle returns the old word
(golden/sram.py SramModel replays exactly this).

The memory array has no initial contents in the emitted RTLIL / Verilog (see
:func:`_emit_without_zero_init`), as an SRAM macro powers up with unknown words. Verilator
starts such an array at zero by default: the contents the Amaranth memory had, and what
SramModel assumes for a word never written (the sram bench reads some), so every bench sees
what it saw before. ``LADMAC_PLUSARGS='+verilator+rand+reset+2'`` (testbenches/runner.py)
starts them at random words instead, to check that a block does not read a word it has not
written.
"""
from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.sram import SramConfig

from .arith import stall_all_enable

# Attribute of the banks' memories (it reaches the Verilog: ``(* ladmac_undefined_init = 1 *)``).
UNDEFINED_INIT = "ladmac_undefined_init"


def _emit_without_zero_init() -> None:
    """Amaranth 0.5 gives every memory defined initial contents (zeros unless ``init`` says
    otherwise; ``lib.memory.Memory`` has no way to leave them undefined) and its RTLIL backend
    emits them as one ``$meminit_v2`` cell of ``depth x width`` constant bits, which Yosys'
    ``write_verilog`` prints as one ``mem[i] = 0;`` line per word (amaranth-lang/amaranth#1522):
    at the LAD tile's defaults 29k of its 99k lines and 14 s of CPU time (5M constant nets built
    in Python, then read back by Yosys), and Verilator compiles them too. This drops that cell for the
    memories that carry :data:`UNDEFINED_INIT` and whose contents are all zero, so their Verilog is
    a bare ``reg [W-1:0] mem [D-1:0];``. Every other memory (FIFOs, the merge unit's buffer,
    a bank given non-zero contents) is emitted as before. Amaranth's own simulator does not use
    this backend (it still starts at zero); SymbiYosys (testbenches/formal) starts such a bank at
    any words, a superset of the zero start."""
    from amaranth.back import rtlil
    emitter = getattr(rtlil, "ModuleEmitter", None)
    original = getattr(emitter, "emit_memory", None)
    if original is None or getattr(original, "ladmac_undefined_init", False):
        return   # another Amaranth layout (the banks keep their zero init), or installed already

    def emit_memory(self, cell_idx, cell):
        if UNDEFINED_INIT in cell.attributes and not any(cell.init):
            return
        original(self, cell_idx, cell)

    emit_memory.ladmac_undefined_init = True
    emitter.emit_memory = emit_memory


_emit_without_zero_init()


def sram_write_layout(cfg: SramConfig) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(cfg.addr_width), "data": unsigned(cfg.width)})


def sram_read_layout(cfg: SramConfig) -> data.StructLayout:
    return data.StructLayout({"addr": unsigned(cfg.addr_width)})


class SramBank(wiring.Component):
    """``write``: (addr, data); ``read{n}_req``: addr; ``read{n}_resp``: data."""

    def __init__(self, cfg: SramConfig):
        self.cfg = cfg
        members = {"write": In(stream.Signature(sram_write_layout(cfg)))}
        for n in range(cfg.read_ports):
            members[f"read{n}_req"] = In(stream.Signature(sram_read_layout(cfg)))
            members[f"read{n}_resp"] = Out(stream.Signature(unsigned(cfg.width)))
        super().__init__(members)

    def read_port(self, n: int):
        return getattr(self, f"read{n}_req"), getattr(self, f"read{n}_resp")

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        m.submodules.mem = mem = memory.Memory(shape=unsigned(cfg.width), depth=cfg.depth, init=[],
                                                   attrs={UNDEFINED_INIT: 1})
        wp = mem.write_port()
        m.d.comb += [self.write.ready.eq(1), wp.en.eq(self.write.valid),
                     wp.addr.eq(self.write.payload.addr), wp.data.eq(self.write.payload.data)]
        for n in range(cfg.read_ports):
            req, resp = self.read_port(n)
            rp = mem.read_port(domain="sync")
            ce = stall_all_enable(resp)
            m.d.comb += [req.ready.eq(ce), rp.en.eq(ce), rp.addr.eq(req.payload.addr)]
            valid = Signal(name=f"p{n}_valid0")
            with m.If(ce):
                m.d.sync += valid.eq(req.valid)
            word = rp.data
            for stage in range(1, cfg.read_latency):
                nxt_valid = Signal(name=f"p{n}_valid{stage}")
                nxt_word = Signal(cfg.width, name=f"p{n}_word{stage}")
                with m.If(ce):
                    m.d.sync += [nxt_valid.eq(valid), nxt_word.eq(word)]
                valid, word = nxt_valid, nxt_word
            m.d.comb += [resp.valid.eq(valid), resp.payload.eq(word)]
        return m
