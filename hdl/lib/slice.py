"""Register slice and FIFO slice: two-entry stream buffers that register both directions of a stream.

``o.valid``/``o.payload`` come from a register and ``i.ready`` is a register (not empty skid
entry), so neither the consumer's decision logic nor its ``ready`` reaches the producer in
the same cycle: put between a block RAM read port (whose stall-all pipeline would otherwise
take ``ready`` into the RAM's clock enable) and logic that decides on the read data. Order
and payloads are unchanged; full throughput (one transfer a cycle) while ``o.ready`` holds.
"""
from __future__ import annotations

from amaranth import Module, Shape, Signal
from amaranth.lib import data, fifo, stream, wiring
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


class FifoSlice(wiring.Component):
    """What :class:`RegisterSlice` does (one cycle, no combinational path from ``i`` to ``o`` or
    from ``o.ready`` to ``i.ready``, two entries, full throughput) as a two-entry
    ``amaranth.lib.fifo.SyncFIFO``: ``o.ready`` moves only the read pointer and the level, not the
    payload registers' enables (a register slice loads its output register when ``o.ready``).
    For a wide payload into a consumer whose ``ready`` is late and far from the payload's
    registers (the tile's AC commands: AC's ready reached 331 payload registers across the die,
    docs/lad-tile.md, Synthesis); ``o.payload`` is the entry the read pointer selects.

    ``flop_fields`` (names of a struct payload's fields, the few a consumer decodes into its
    control): those fields come from a :class:`RegisterSlice` beside the FIFO instead, so they leave
    a flip-flop rather than a LUT-RAM read at the end of a long route (the tile's AC decoded its
    command's ``op`` from the FIFO's read: 92.87 MHz). Both queues hold two entries,
    take an input while not full and give one while not empty, so they move in lockstep."""

    def __init__(self, shape, flop_fields=()):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})
        self._width = Shape.cast(shape).width
        self._flops = data.StructLayout({name: shape[name].shape for name in flop_fields}) if flop_fields else None

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = queue = fifo.SyncFIFO(width=self._width, depth=2)
        m.d.comb += [queue.w_data.eq(self.i.payload), queue.w_en.eq(self.i.valid), self.i.ready.eq(queue.w_rdy),
                     self.o.payload.eq(queue.r_data), self.o.valid.eq(queue.r_rdy), queue.r_en.eq(self.o.ready)]
        if self._flops is not None:
            m.submodules.flops = flops = RegisterSlice(self._flops)
            m.d.comb += [flops.i.valid.eq(self.i.valid), flops.o.ready.eq(self.o.ready)]
            for name in self._flops.members:
                m.d.comb += [flops.i.payload[name].eq(self.i.payload[name]), self.o.payload[name].eq(flops.o.payload[name])]
        return m
