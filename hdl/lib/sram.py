"""SRAM bank: an ``amaranth.lib.memory.Memory`` behind stream ports.

One write stream (always ready) and ``read_ports`` request/response stream pairs. Each
read port is a ``read_latency``-stage pipeline that stalls as a whole when its response
is not taken (the memory's read enable is held low, so the word is kept). Reads are
not transparent: a read and a write to the same word in one cycle returns the old word
(golden/sram.py SramModel replays exactly this).
"""
from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.sram import SramConfig

from .arith import stall_all_enable


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
        m.submodules.mem = mem = memory.Memory(shape=unsigned(cfg.width), depth=cfg.depth, init=[])
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
