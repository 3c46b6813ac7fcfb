"""Register slice: a two-entry stream buffer that registers both directions of a stream.

``o.valid``/``o.payload`` come from a register and ``i.ready`` is a register (not empty skid
entry), so neither the consumer's decision logic nor its ``ready`` reaches the producer in
the same cycle: put between a block RAM read port (whose stall-all pipeline would otherwise
take ``ready`` into the RAM's clock enable) and logic that decides on the read data. Order
and payloads are unchanged; full throughput (one transfer a cycle) while ``o.ready`` holds.
"""
from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class RegisterSlice(wiring.Component):
    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})
        self._shape = shape

    def elaborate(self, platform):
        m = Module()
        main_valid, skid_valid = Signal(), Signal()
        main, skid = Signal(self._shape), Signal(self._shape)
        m.d.comb += [self.o.valid.eq(main_valid), self.o.payload.eq(main), self.i.ready.eq(~skid_valid)]
        take_in = self.i.valid & self.i.ready
        take_out = self.o.valid & self.o.ready
        with m.If(take_out | ~main_valid):          # main is free this cycle: it takes the skid or the input
            with m.If(skid_valid):
                m.d.sync += [main.eq(skid), skid_valid.eq(take_in)]
                with m.If(take_in):
                    m.d.sync += skid.eq(self.i.payload)
            with m.Else():
                m.d.sync += [main.eq(self.i.payload), main_valid.eq(take_in)]
        with m.Elif(take_in):                       # main is held: the input waits in the skid entry
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
