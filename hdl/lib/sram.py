"""SRAM bank: an ``amaranth.lib.memory.Memory`` behind stream ports.

One write stream (always ready) and ``read_ports`` request/response stream pairs. Each
read port is a ``read_latency``-stage pipeline that stalls as a whole when its response
is not taken (the memory's read enable is held low, so the word is kept). Reads are
not transparent: a read and a write to the same word in one cycle returns the old word
(golden/sram.py SramModel replays exactly this).

With ``read_latency >= 2`` the array is a grid of block-RAM tiles (:func:`bram_tile`: banks of
one DP16KD's depth, slices of its width) and the second stage registers every tile's read
data on its own, before the bank is selected: on the ECP5 that register becomes the block
RAM's output register (synth/flow.py), so no read path starts at the RAM's slow output pins.
The bank select then spreads over the stages left: with ``read_latency`` 4 a first registered
stage picks within groups of banks (the bank index's low bits), the last among the groups, so
no path crosses the device through one wide mux. ``address_register`` (read_latency >= 4) adds a
register in front of the RAMs' address pins: that read pipeline runs at a fixed latency into an output FIFO (it
cannot stall: a stalled read would reach the RAMs after later writes) and takes a request only
while the FIFO has room for every read in flight.

The memory array has no initial contents in the emitted RTLIL / Verilog (see
:func:`_emit_without_zero_init`), as an SRAM macro powers up with unknown words. Verilator
starts such an array at zero by default: the contents the Amaranth memory had, and what
SramModel assumes for a word never written (the sram bench reads some), so every bench sees
what it saw before. ``LADMAC_PLUSARGS='+verilator+rand+reset+2'`` (testbenches/runner.py)
starts them at random words instead, to check that a block does not read a word it has not
written.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from golden.sram import SramConfig

from .arith import index_width, stall_all_enable

# Attribute of the banks' memories (it reaches the Verilog: ``(* ladmac_undefined_init = 1 *)``).
UNDEFINED_INIT = "ladmac_undefined_init"
# Attribute of a tiled bank's memories: their number of read ports, each of which may read
# undefined data in a cycle in which the word is written (the bank bypasses that read).
COLLISION_X = "ladmac_collision_x"


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


# Geometries of one ECP5 DP16KD in true dual-port mode (depth, width): a bank with a
# registered read (read_latency >= 2) is built of memories of exactly one of these, so that
# each maps onto one block RAM with no depth-cascade mux between its output pins and the
# register that follows them.
DP16KD_GEOMETRIES = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18))
# The pseudo dual-port mode (one write port, one read port): 512 x 36.
DP16KD_PSEUDO_DUAL_PORT = (512, 36)


def bram_tile(depth: int, width: int, read_ports: int = 2) -> tuple[int, int]:
    """The (depth, width) of the block-RAM tiles of a ``depth x width`` bank: the geometry
    needing the fewest tiles, the deepest among equals (fewer banks to select from); a bank
    with one read port may also use the 512 x 36 pseudo dual-port mode, where that needs fewer
    tiles (256 x 32: one block RAM, not two 1024 x 18)."""
    def tiles(g):
        return -(-depth // g[0]) * -(-width // g[1])
    best = min(DP16KD_GEOMETRIES, key=lambda g: (tiles(g), -g[0]))
    if read_ports == 1 and tiles(DP16KD_PSEUDO_DUAL_PORT) < tiles(best):
        return DP16KD_PSEUDO_DUAL_PORT
    return best


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
        tiled = cfg.read_latency >= 2
        tile_depth, tile_width = bram_tile(cfg.depth, cfg.width, cfg.read_ports) if tiled else (cfg.depth, cfg.width)
        # a tiled bank handles reads that meet a write itself (below), so Yosys may leave
        # them undefined in the block RAMs (synth/flow.py: COLLISION_X_MASK)
        attrs = {UNDEFINED_INIT: 1, **({COLLISION_X: cfg.read_ports} if tiled else {})}
        tiles = [[memory.Memory(shape=unsigned(min(tile_width, cfg.width - lo)),
                                depth=min(tile_depth, cfg.depth - bank * tile_depth), init=[], attrs=attrs)
                  for lo in range(0, cfg.width, tile_width)]
                 for bank in range(-(-cfg.depth // tile_depth))]
        for b, row in enumerate(tiles):
            for t, tile in enumerate(row):
                m.submodules[f"mem_{b}_{t}"] = tile
        banked = len(tiles) > 1
        low = index_width(tile_depth) if banked else cfg.addr_width
        # address_register: the read address reaches the RAMs from a register (a cycle after the
        # request), so the read pipeline cannot stall (a stalled read would reach the RAMs after
        # later writes): it runs at a fixed latency into an output FIFO, and a request is taken
        # only while the FIFO has room for every read in flight. The write lands a cycle later
        # too, so reads still see exactly the writes accepted before them.
        registered_address = cfg.address_register

        # The write. Tiled: it reaches the RAMs a cycle later (registered; two with
        # address_register, as the reads reach them a cycle later too), and a read in that cycle
        # of the same word takes the registered data instead of the RAM's: reads still see every
        # write of earlier cycles and none of their own cycle (read-before-write).
        m.d.comb += self.write.ready.eq(1)
        w_valid, w_addr, w_data = self.write.valid, self.write.payload.addr, self.write.payload.data
        for stage in range(int(tiled) + int(registered_address)):   # the write's register stages
            nxt = (Signal(name=f"w_valid{stage}"), Signal.like(w_addr, name=f"w_addr{stage}"),
                   Signal.like(w_data, name=f"w_data{stage}"))
            m.d.sync += [a.eq(b) for a, b in zip(nxt, (w_valid, w_addr, w_data))]
            w_prev, (w_valid, w_addr, w_data) = (w_valid, w_addr, w_data), nxt
        for b, row in enumerate(tiles):
            if tiled and banked:
                # each bank's write from its own copy of the last stage, loaded only for that bank
                # (so Yosys keeps the copies apart): its tiles' enable, address and data come
                # straight from a register, not from one decode and one address fanned out to
                # every tile of every bank (lad-eas's 125 DP16KD: 8.7 ns of routing to one WEA)
                prev_valid, prev_addr, prev_data = w_prev
                b_en, b_addr, b_data = (Signal(name=f"w_en_bank{b}"), Signal(low, name=f"w_addr_bank{b}"),
                                        Signal.like(w_data, name=f"w_data_bank{b}"))
                hit = prev_valid & (prev_addr[low:] == b)
                m.d.sync += b_en.eq(hit)
                with m.If(hit):
                    m.d.sync += [b_addr.eq(prev_addr[:low]), b_data.eq(prev_data)]
            else:
                b_en, b_addr, b_data = w_valid & ((w_addr[low:] == b) if banked else 1), w_addr[:low], w_data
            for t, tile in enumerate(row):
                wp = tile.write_port()
                m.d.comb += [wp.en.eq(b_en), wp.addr.eq(b_addr), wp.data.eq(b_data[t * tile_width:][:tile.shape.width])]

        for n in range(cfg.read_ports):
            req, resp = self.read_port(n)
            rps = [[tile.read_port(domain="sync") for tile in row] for row in tiles]
            if registered_address:
                ce = Const(1)
                m.submodules[f"p{n}_out"] = out = SyncFIFO(width=cfg.width, depth=cfg.read_latency)
                pending = Signal(range(cfg.read_latency + 1), name=f"p{n}_pending")   # taken, not yet answered
                m.d.comb += [req.ready.eq((pending < cfg.read_latency) | (resp.valid & resp.ready)),
                             resp.valid.eq(out.r_rdy), resp.payload.eq(out.r_data), out.r_en.eq(resp.ready)]
                m.d.sync += pending.eq(pending + (req.valid & req.ready) - (resp.valid & resp.ready))
                addr, asked = Signal.like(req.payload.addr, name=f"p{n}_addr"), Signal(name=f"p{n}_asked")
                m.d.sync += [addr.eq(req.payload.addr), asked.eq(req.valid & req.ready)]
            else:
                ce = stall_all_enable(resp)
                m.d.comb += req.ready.eq(ce)
                addr, asked = req.payload.addr, req.valid
            m.d.comb += [x for row in rps for rp in row for x in (rp.en.eq(ce), rp.addr.eq(addr[:low]))]
            valid = Signal(name=f"p{n}_valid0")
            with m.If(ce):
                m.d.sync += valid.eq(asked)
            if not tiled:
                word = rps[0][0].data
            else:
                # stage 1: the RAMs' read; the bank and the write met (registered here)
                bank = Signal(range(max(2, len(tiles))), name=f"p{n}_bank0")
                bypass, bypass_data = Signal(name=f"p{n}_bypass0"), Signal(cfg.width, name=f"p{n}_bypass_data0")
                with m.If(ce):
                    m.d.sync += [bank.eq(addr[low:] if banked else 0),
                                 bypass.eq(w_valid & (w_addr == addr)), bypass_data.eq(w_data)]
                # stage 2: every tile's read data registered on its own, with no logic between
                # the RAM and the register (synth/flow.py moves it into the DP16KD's output
                # register); then the addressed bank's word, or the write's
                regs = [Signal(cfg.width, name=f"p{n}_tiles{b}", reset_less=True) for b in range(len(tiles))]
                valid1, bank1 = Signal(name=f"p{n}_valid1"), Signal.like(bank, name=f"p{n}_bank1")
                bypass1, bypass_data1 = Signal(name=f"p{n}_bypass1"), Signal.like(bypass_data, name=f"p{n}_bypass_data1")
                with m.If(ce):
                    m.d.sync += [reg.eq(Cat(rp.data for rp in row)) for reg, row in zip(regs, rps)]
                    m.d.sync += [valid1.eq(valid), bank1.eq(bank), bypass1.eq(bypass), bypass_data1.eq(bypass_data)]
                valid, bank, bypass, bypass_data = valid1, bank1, bypass1, bypass_data1
                # then the bank mux as a tree over the stages left (each registered): every
                # stage but the last picks within groups of banks by the bank index's low bits
                words, levels = regs, max(1, cfg.read_latency - 2 - registered_address)
                step = -(-index_width(len(tiles)) // levels) if banked else 0
                for stage in range(2, cfg.read_latency - 1 - registered_address):
                    sel, bank_rest = bank[:step], bank[step:]
                    words = [Array(words[g:g + 2 ** step])[sel] if len(words[g:g + 2 ** step]) > 1 else words[g]
                             for g in range(0, len(words), 2 ** step)]
                    nxt_words = [Signal(cfg.width, name=f"p{n}_group{stage}_{g}") for g in range(len(words))]
                    nxt = [Signal(name=f"p{n}_valid{stage}"), Signal(len(bank_rest), name=f"p{n}_bank{stage}"),
                           Signal(name=f"p{n}_bypass{stage}"), Signal.like(bypass_data, name=f"p{n}_bypass_data{stage}")]
                    with m.If(ce):
                        m.d.sync += [a.eq(b) for a, b in zip(nxt_words, words)]
                        m.d.sync += [a.eq(b) for a, b in zip(nxt, (valid, bank_rest, bypass, bypass_data))]
                    words, (valid, bank, bypass, bypass_data) = nxt_words, nxt
                word = Mux(bypass, bypass_data, Array(words)[bank] if len(words) > 1 else words[0])
                if registered_address:   # the FIFO's write is the last register
                    m.d.comb += [out.w_en.eq(valid), out.w_data.eq(word)]
                    continue
                if cfg.read_latency >= 3:
                    nxt_valid = Signal(name=f"p{n}_valid{cfg.read_latency - 1}")
                    nxt_word = Signal(cfg.width, name=f"p{n}_word{cfg.read_latency - 1}")
                    with m.If(ce):
                        m.d.sync += [nxt_valid.eq(valid), nxt_word.eq(word)]
                    valid, word = nxt_valid, nxt_word
            m.d.comb += [resp.valid.eq(valid), resp.payload.eq(word)]
        return m
