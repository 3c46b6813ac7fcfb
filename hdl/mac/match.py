"""Match unit: ring windows of pre-RoPE queries, best earlier query by squared L2 distance.

Implements golden.mac_unit.MatchModel bit for bit (docs/algorithms.md §2, "Match"). A query
arrives as ``head_dim/lanes`` beats on ``query`` (its head taken from the first); the unit
streams every valid slot of that head's ring from an SRAM bank (oldest position first) through
the VPU's SQDIST, keeps the strict minimum (so ties go to the lower position), emits
``(hit, slot, position, distance)`` on ``result`` and then writes the query into the
ring at slot ``position mod window``. Cycles per match ~ ``valid_slots * d/lanes``
plus a few for load, result and write-back.

Timing (docs/synthesis.md): the ring is banked by its address's high bits, each bank one
block RAM deep (2048 words: DP16KD as 2K x 9). The read request is registered before the
banks' address pins (and the write, which lands a cycle later, while the next query
loads); a bank's read data goes straight into a register next to it (the placer keeps
it there: nothing else is in that stage); the bank select follows in two registered
steps (a pair of banks, then the pair), the second with the query beat it is compared
against (read latency 5).
The read pipeline stalls as a whole with the VPU's input. The reported position is kept
per compared slot during the scan (no add after it).
"""
from __future__ import annotations

from typing import NamedTuple

from amaranth import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.mac_unit import MacUnitConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, index_width
from ..lib.pipe import delayed_write
from ..lib.sram import COLLISION_X
from ..lib.vpu import Vpu

RING_BANK_DEPTH = 2048   # words per ring bank: one DP16KD deep (2K x 9)



def match_query_layout(cfg: MacUnitConfig) -> data.StructLayout:
    return data.StructLayout({
        "head": unsigned(index_width(cfg.heads)),
        "q": data.ArrayLayout(signed(cfg.q_width), cfg.lanes),
    })


def match_result_layout(cfg: MacUnitConfig) -> data.StructLayout:
    return data.StructLayout({
        "hit": unsigned(1),
        "slot": unsigned(index_width(cfg.window)),
        "position": unsigned(cfg.position_width),
        "distance": unsigned(cfg.vpu.acc_width),
    })


class _Ring(NamedTuple):
    """What the scan uses of the ring: the query buffer, the read request, write and response streams."""
    query_buf: Array
    req_beat: Signal
    req: object
    write: object
    resp: object
    resp_q: Signal
    resp_last: Signal


class MatchUnit(wiring.Component):
    """``query``: beats of (head, q lanes); ``result``: one per query."""

    def __init__(self, cfg: MacUnitConfig):
        self.cfg = cfg
        super().__init__({
            "query": In(stream.Signature(match_query_layout(cfg))),
            "result": Out(stream.Signature(match_result_layout(cfg))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.vpu = vpu = Vpu(self.cfg.vpu, ops=[VpuOp.SQDIST])
        ring = self._ring(m)
        self._scan(m, vpu, ring)
        return m

    def _ring(self, m) -> _Ring:
        """The ring's banks, its registered write and its read pipeline (request to the compared word)."""
        cfg = self.cfg
        nb = cfg.beats
        word = cfg.lanes * cfg.q_width
        # -- the ring: banks of RING_BANK_DEPTH words; read pipeline: bank read (all banks
        # at the low address bits); each bank's word registered; the addressed bank's word
        bank_depth = min(cfg.ring_words, RING_BANK_DEPTH)
        n_banks = -(-cfg.ring_words // bank_depth)
        low = index_width(bank_depth)
        # no read ever meets a write in a bank (reads only in SCAN, writes only in WRITE, and a
        # write lands 2 cycles after WRITE while the next SCAN's first read reaches the banks
        # >= 4 cycles after it: LOAD >= 1 cycle, PREPARE, the request register), so the banks
        # may leave that case undefined (no read-before-write logic around the RAMs: synth/flow.py)
        banks = [memory.Memory(shape=unsigned(word), depth=min(bank_depth, cfg.ring_words - b * bank_depth), init=[],
                               attrs={COLLISION_X: 1})
                 for b in range(n_banks)]
        for b, bank in enumerate(banks):
            m.submodules[f"ring{b}"] = bank
        wports = [bank.write_port() for bank in banks]
        rports = [bank.read_port(domain="sync") for bank in banks]
        query_buf = Array(Signal(word, name=f"query_beat{b}") for b in range(nb))
        req_beat = Signal(range(nb))   # the beat of the word requested (selects the query beat at r2)
        req = stream.Signature(data.StructLayout({"addr": unsigned(low + index_width(n_banks))})).create()
        write = stream.Signature(data.StructLayout({"addr": unsigned(low + index_width(n_banks)),
                                                    "data": unsigned(word)})).create()
        resp = stream.Signature(unsigned(word)).create()
        ce = Signal()
        m.d.comb += [ce.eq(~resp.valid | resp.ready), req.ready.eq(ce)]
        r0_valid, r1_valid = Signal(), Signal()
        r0_bank, r1_bank = Signal(index_width(n_banks)), Signal(index_width(n_banks))
        r0_beat, r1_beat, r2_beat = Signal(range(nb)), Signal(range(nb)), Signal(range(nb))
        # bank select in two registered steps: a pair of banks (by the bank's low bit), then the pair
        n_pairs = -(-n_banks // 2)
        r2_valid, r2_pair = Signal(), Signal(max(1, index_width(n_banks) - 1))
        r2_word = Array(Signal(word, name=f"ring_pair{g}") for g in range(n_pairs))
        resp_q, resp_last = Signal(word), Signal()   # the query beat and ``last``, registered with the ring word
        r1_word = Array(Signal(word, name=f"ring_word{b}", reset_less=True) for b in range(n_banks))  # -> DP16KD OUTREG
        # the request registered before the banks (their address pins are far apart), the
        # write likewise (it lands a cycle later, while the next query loads)
        ra_valid, ra_addr, ra_beat = Signal(), Signal.like(req.payload.addr), Signal(range(nb))
        w_valid, w_addr, w_data = Signal(), Signal.like(write.payload.addr), Signal(word)
        m.d.sync += [w_valid.eq(write.valid), w_addr.eq(write.payload.addr), w_data.eq(write.payload.data)]
        # the banks are written one cycle later still (the write's register next to them)
        wb_valid, wb_addr, wb_data = Signal(), Signal.like(w_addr), Signal(word)
        m.d.sync += [wb_valid.eq(w_valid), wb_addr.eq(w_addr), wb_data.eq(w_data)]
        for b in range(n_banks):
            m.d.comb += [rports[b].addr.eq(ra_addr[:low]), rports[b].en.eq(ce),
                         wports[b].addr.eq(wb_addr[:low]), wports[b].data.eq(wb_data),
                         wports[b].en.eq(wb_valid & ((wb_addr[low:] == b) if n_banks > 1 else 1))]
        with m.If(ce):
            m.d.sync += [ra_valid.eq(req.valid), ra_addr.eq(req.payload.addr), ra_beat.eq(req_beat),
                         r0_valid.eq(ra_valid), r0_bank.eq(ra_addr[low:] if n_banks > 1 else 0),
                         r1_valid.eq(r0_valid), r1_bank.eq(r0_bank), r2_valid.eq(r1_valid),
                         r2_pair.eq(r1_bank[1:] if n_banks > 2 else 0), resp.valid.eq(r2_valid),
                         resp.payload.eq(r2_word[r2_pair]),
                         r0_beat.eq(ra_beat), r1_beat.eq(r0_beat), r2_beat.eq(r1_beat),
                         resp_q.eq(query_buf[r2_beat]), resp_last.eq(r2_beat == nb - 1)]
            m.d.sync += [r2_word[g].eq(Mux(r1_bank[0], r1_word[2 * g + 1], r1_word[2 * g]) if 2 * g + 1 < n_banks
                                       else r1_word[2 * g]) for g in range(n_pairs)]
            m.d.sync += [r1_word[b].eq(rports[b].data) for b in range(n_banks)]
        return _Ring(query_buf, req_beat, req, write, resp, resp_q, resp_last)

    def _scan(self, m, vpu, ring: _Ring):
        """Per-head ring state and the FSM: load the query, scan the ring through SQDIST, result, write."""
        cfg = self.cfg
        nb, window = cfg.beats, cfg.window
        query_buf, req_beat, req, write, resp = ring.query_buf, ring.req_beat, ring.req, ring.write, ring.resp
        head = Signal(index_width(cfg.heads))
        # Per-head ring state: next position, next slot (position mod window), filled slots.
        positions = Array(Signal(cfg.position_width, name=f"position{h}") for h in range(cfg.heads))
        write_slots = Array(Signal(range(window), name=f"write_slot{h}") for h in range(cfg.heads))
        filled_slots = Array(Signal(range(window + 1), name=f"filled{h}") for h in range(cfg.heads))
        filled = Signal(range(window + 1))

        load_beat = Signal(range(nb))
        issue_count, issue_slot, issue_beat = Signal(range(window + 1)), Signal(range(window)), Signal(range(nb))
        result_count, result_slot = Signal(range(window)), Signal(range(window))   # results before the last
        best_distance = Signal(cfg.vpu.acc_width)
        best_slot = Signal(range(window))
        # position of the result being compared (the oldest valid slot's position plus its
        # index) and of the best so far: the reported position needs no add after the scan
        result_position, best_position = Signal(cfg.position_width), Signal(cfg.position_width)
        write_beat = Signal(range(nb))

        def ring_address(slot, beat):
            """Word address: the bank in the high bits, the word in the bank in the low bits
            (bank_depth is a power of two where there are several banks)."""
            return (head * window + slot) * nb + beat

        # Read responses feed the VPU (SQDIST against the buffered query beat).
        m.d.comb += [
            vpu.i.valid.eq(resp.valid), resp.ready.eq(vpu.i.ready),
            vpu.i.payload.op.eq(VpuOp.SQDIST), vpu.i.payload.last.eq(ring.resp_last),
            vpu.i.payload.a.eq(resp.payload), vpu.i.payload.b.eq(ring.resp_q),
            vpu.o.ready.eq(1),
        ]

        max_distance = (1 << (cfg.vpu.acc_width - 1)) - 1
        # a query beat lands in query_buf a cycle after LOAD takes it, from registered copies: the
        # producer's ``valid`` then reaches a few registers, not the buffer's every bit (in the
        # decode engine, its FSM's decode into them was 448 endpoints at 11.7 ns routed, 84.8 MHz);
        # the scan reads the buffer at its read pipeline's third stage, WRITE after the scan
        take = Signal()
        delayed_write(m, query_buf, take, load_beat, self.query.payload.q, "query_write")
        with m.FSM():
            with m.State("LOAD"):
                m.d.comb += [self.query.ready.eq(1), take.eq(self.query.valid)]
                with m.If(self.query.valid):
                    m.d.sync += load_beat.eq(incr(load_beat, nb))
                    with m.If(load_beat == 0):
                        m.d.sync += head.eq(self.query.payload.head)
                    with m.If(load_beat == nb - 1):
                        m.next = "PREPARE"
            with m.State("PREPARE"):
                count = filled_slots[head]
                m.d.sync += [
                    filled.eq(count),
                    issue_count.eq(0), issue_slot.eq(Mux(count == window, write_slots[head], 0)), issue_beat.eq(0),
                    result_count.eq(0), result_slot.eq(Mux(count == window, write_slots[head], 0)),
                    best_distance.eq(max_distance), best_slot.eq(0),
                    result_position.eq(positions[head] - count), best_position.eq(positions[head] - count),
                ]
                with m.If(count == 0):
                    m.next = "RESULT"
                with m.Else():
                    m.next = "SCAN"
            with m.State("SCAN"):
                m.d.comb += [req.valid.eq(issue_count < filled),
                             req.payload.addr.eq(ring_address(issue_slot, issue_beat)), req_beat.eq(issue_beat)]
                with m.If(req.valid & req.ready):
                    m.d.sync += issue_beat.eq(incr(issue_beat, nb))
                    with m.If(issue_beat == nb - 1):
                        m.d.sync += [issue_count.eq(issue_count + 1),
                                     issue_slot.eq(incr(issue_slot, window))]
                with m.If(vpu.o.valid):
                    m.d.sync += [result_count.eq(result_count + 1), result_position.eq(result_position + 1),
                                 result_slot.eq(incr(result_slot, window))]
                    with m.If(vpu.o.payload.dot.as_unsigned() < best_distance):
                        m.d.sync += [best_distance.eq(vpu.o.payload.dot), best_slot.eq(result_slot),
                                     best_position.eq(result_position)]
                    with m.If(result_count == filled - 1):
                        m.next = "RESULT"
            with m.State("RESULT"):
                m.d.comb += [
                    self.result.valid.eq(1),
                    self.result.payload.hit.eq((filled != 0) & (best_distance < cfg.threshold_raw)),
                    self.result.payload.slot.eq(best_slot),
                    self.result.payload.position.eq(
                        Mux(filled == 0, 0, best_position)),
                    self.result.payload.distance.eq(best_distance),
                ]
                with m.If(self.result.ready):
                    m.d.sync += write_beat.eq(0)
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [write.valid.eq(1),
                             write.payload.addr.eq(ring_address(write_slots[head], write_beat)),
                             write.payload.data.eq(query_buf[write_beat])]
                m.d.sync += write_beat.eq(write_beat + 1)
                with m.If(write_beat == nb - 1):
                    slot = write_slots[head]
                    m.d.sync += [positions[head].eq(positions[head] + 1),
                                 write_slots[head].eq(incr(slot, window)),
                                 filled_slots[head].eq(Mux(filled_slots[head] == window, window,
                                                           filled_slots[head] + 1))]
                    m.next = "LOAD"
