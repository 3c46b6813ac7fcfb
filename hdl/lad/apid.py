"""APID: active-position identification (docs/algorithms.md §1.4; golden/lad_tile.py steps 2 and 4).

Owns the per-position metadata SRAM (mode, counters, center, rho) and a buffer of this
step's approximate scores. ``scan`` with ``classify = 0`` (pass A) reads every absorbed
position's metadata, asks EAS for ``s^_i`` (``lookup``/``approx``), keeps it and emits the
maximum on ``smax``. ``classify = 1`` (pass B, with ``m``): ``x^_i = sat(s^_i - m)``; a position
inside its guarded mode interval bumps its mode counter; the others go to MD on ``cand``
without waiting: MD's ``verdict`` (position, new mode and counters; in candidate order) is
written back whenever it comes, with the center and rho kept in a FIFO of the candidates in
flight (``md_inflight`` deep; a verdict's write takes the metadata port before a quiet
position's). ``done`` reports the candidates once every verdict is back. ``absorb`` writes the
new position (its interval as mode, counter 1). One position per cycle where nothing waits.
"""
from __future__ import annotations

from amaranth import Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig

from ..lib.slice import RegisterSlice
from ..lib.sram import SramBank
from .common import bump_terms, bumped_counters, candidate_layout, meta_layout, mode_thresholds, require_built, sram_banks
from .eas import lookup_layout


def scan_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"length": unsigned(cfg.position_width), "m": signed(cfg.sfm.x_width),
                              "classify": unsigned(1)})


def absorb_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"position": unsigned(cfg.position_width), "center": unsigned(cfg.center_width),
                              "rho": signed(cfg.rho_width), "mode": unsigned(cfg.sfm.interval_width)})


class Apid(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = require_built(cfg)
        xw = cfg.sfm.x_width
        super().__init__({
            "scan": In(stream.Signature(scan_layout(cfg))),
            "lookup": Out(stream.Signature(lookup_layout(cfg))),
            "approx": In(stream.Signature(signed(xw))),
            "smax": Out(stream.Signature(signed(xw))),
            "cand": Out(stream.Signature(candidate_layout(cfg))),
            "verdict": In(stream.Signature(candidate_layout(cfg))),
            "done": Out(stream.Signature(unsigned(cfg.position_width))),
            "absorb": In(stream.Signature(absorb_layout(cfg))),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        xw = cfg.sfm.x_width
        ml = meta_layout(cfg)
        banks = sram_banks(cfg)
        m.submodules.meta_mem = meta = SramBank(banks["apid.metadata"])
        m.submodules.approx_mem = amem = SramBank(banks["apid.approx_scores"])
        meta_req, meta_raw = meta.read_port(0)
        a_req, a_raw = amem.read_port(0)
        length = Signal(cfg.position_width)
        # The two read ports (in lockstep: same addresses, same cycles) through three register
        # slices, so the decisions neither follow the RAMs' read data nor drive their clock
        # enables: after the first, s^_i against every interval's two thresholds (bound + m, in
        # parallel) and the mode counter's bump terms; after the second, the verdict for the
        # position's mode and the bumped counters; the third holds them for the state machine.
        mw = len(meta_raw.payload)
        R = cfg.n_intervals
        cw = cfg.counter_bits * R
        compare, pick = mode_thresholds(m, self.scan.payload.m, self.scan.valid & self.scan.ready, cfg)
        m.submodules.resp_slice = resp_slice = RegisterSlice(mw + xw)
        resp = resp_slice.o.payload
        resp_word = data.View(ml, resp[:mw])
        terms = bump_terms(resp_word.counters, resp_word.mode, cfg)   # the mode's counter bumped (a quiet step)
        bw = len(terms)
        m.submodules.cmp_slice = cmp_slice = RegisterSlice(mw + bw + 2 * R)
        m.submodules.test_slice = test_slice = RegisterSlice(mw + 1 + cw)
        m.d.comb += [resp_slice.i.valid.eq(meta_raw.valid),
                     resp_slice.i.payload.eq(Cat(meta_raw.payload, a_raw.payload)),
                     meta_raw.ready.eq(resp_slice.i.ready), a_raw.ready.eq(resp_slice.i.ready)]
        # the tests and terms in a plain register stage before cmp_slice, so the compares' carry
        # chains end at a flip-flop and not in the slice's skid mux
        cmp_valid, cmp_in = Signal(), Signal(mw + bw + 2 * R)
        cmp_ce = ~cmp_valid | cmp_slice.i.ready
        m.d.comb += [resp_slice.o.ready.eq(cmp_ce), cmp_slice.i.valid.eq(cmp_valid), cmp_slice.i.payload.eq(cmp_in)]
        with m.If(cmp_ce):
            m.d.sync += [cmp_valid.eq(resp_slice.o.valid),
                         cmp_in.eq(Cat(resp[:mw], terms, compare(resp[mw:].as_signed())))]
        cmp = cmp_slice.o.payload
        cmp_word = data.View(ml, cmp[:mw])
        bumped_raw = bumped_counters(m, cmp[mw:mw + bw], cfg, "quiet_counters")
        m.d.comb += [test_slice.i.valid.eq(cmp_slice.o.valid), cmp_slice.o.ready.eq(test_slice.i.ready),
                     test_slice.i.payload.eq(Cat(cmp[:mw], pick(cmp[mw + bw:], cmp_word.mode), bumped_raw))]
        meta_resp = test_slice.o
        meta_data = test_slice.o.payload[:mw]
        is_cand = test_slice.o.payload[mw]
        bumped = data.View(data.ArrayLayout(unsigned(cfg.counter_bits), cfg.n_intervals), test_slice.o.payload[mw + 1:])

        issued = Signal(cfg.position_width)
        finished = Signal(cfg.position_width)
        best = Signal(signed(xw))
        candidates = Signal(cfg.position_width)
        # candidates sent to MD, verdict not yet back: their (center, rho), in order
        m.submodules.pending = pending = SyncFIFO(width=cfg.center_width + cfg.rho_width, depth=cfg.md_inflight)

        # pass A's s^_i, taken whenever they come (only APPROX's lookups make them, and APPROX
        # leaves once all are in): EAS's lookup pipeline never stalls on APID's state (APID's
        # state -> approx.ready -> EAS's enables crossed between the blocks)
        m.d.comb += self.approx.ready.eq(1)
        with m.If(self.approx.valid):
            m.d.comb += [amem.write.valid.eq(1), amem.write.payload.addr.eq(finished),
                         amem.write.payload.data.eq(self.approx.payload)]
            m.d.sync += finished.eq(finished + 1)
            with m.If(self.approx.payload > best):
                m.d.sync += best.eq(self.approx.payload)

        # the maximum and the candidate count, read only while valid (MAX, DONE): their payloads
        # do not decode the state (that decode, gated into each bit, led the tile's compare with m
        # into m's enable: tile 88.0 MHz, seed 2)
        m.d.comb += [self.smax.payload.eq(best), self.done.payload.eq(candidates)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.scan.ready.eq(1)
                with m.If(self.scan.valid):
                    p = self.scan.payload
                    m.d.sync += [length.eq(p.length), issued.eq(0), finished.eq(0),
                                 best.eq(-(1 << (xw - 1))), candidates.eq(0)]
                    with m.If(p.classify):
                        m.next = "CLASSIFY"
                    with m.Else():
                        m.next = "APPROX"
                # the new position's metadata, between steps (the tile never sends a scan with it;
                # ready from the state alone: the tile's state does not reach its own next state here)
                m.d.comb += self.absorb.ready.eq(1)
                with m.If(self.absorb.valid):
                    a = self.absorb.payload
                    word = Signal(ml)
                    m.d.comb += [word.mode.eq(a.mode), word.center.eq(a.center), word.rho.eq(a.rho)]
                    for r in range(cfg.n_intervals):
                        m.d.comb += word.counters[r].eq(a.mode == r)
                    m.d.comb += [meta.write.valid.eq(1), meta.write.payload.addr.eq(a.position),
                                 meta.write.payload.data.eq(word)]

            with m.State("APPROX"):   # pass A: s^_i of every position, and their maximum
                m.d.comb += [meta_req.valid.eq(issued < length), meta_req.payload.addr.eq(issued)]
                with m.If(meta_req.valid & meta_req.ready):
                    m.d.sync += issued.eq(issued + 1)
                word = data.View(ml, meta_data)
                m.d.comb += [self.lookup.valid.eq(meta_resp.valid), self.lookup.payload.center.eq(word.center),
                             self.lookup.payload.rho.eq(word.rho), meta_resp.ready.eq(self.lookup.ready)]
                with m.If(finished == length):
                    m.next = "MAX"
            with m.State("MAX"):
                m.d.comb += self.smax.valid.eq(1)   # its payload, best, outside the FSM
                with m.If(self.smax.ready):
                    m.next = "IDLE"

            with m.State("CLASSIFY"):   # pass B: quiet positions bump their mode, candidates go to MD
                m.d.comb += [meta_req.valid.eq(issued < length), meta_req.payload.addr.eq(issued),
                             a_req.valid.eq(issued < length), a_req.payload.addr.eq(issued)]
                with m.If(meta_req.valid & meta_req.ready):
                    m.d.sync += issued.eq(issued + 1)
                word = data.View(ml, meta_data)
                # a verdict is written back as it comes (it has the metadata port first)
                v_write = Signal()
                m.d.comb += [self.verdict.ready.eq(pending.r_rdy), v_write.eq(self.verdict.valid & pending.r_rdy),
                             pending.r_en.eq(v_write)]
                kept = Signal(ml)
                m.d.comb += [kept.center.eq(pending.r_data[:cfg.center_width]),
                             kept.rho.eq(pending.r_data[cfg.center_width:]),
                             kept.mode.eq(self.verdict.payload.mode), kept.counters.eq(self.verdict.payload.counters)]
                take_quiet, take_cand = Signal(), Signal()
                m.d.comb += [self.cand.valid.eq(meta_resp.valid & is_cand & pending.w_rdy),
                             self.cand.payload.position.eq(finished), self.cand.payload.mode.eq(word.mode),
                             self.cand.payload.counters.eq(word.counters),
                             take_cand.eq(self.cand.valid & self.cand.ready),
                             take_quiet.eq(meta_resp.valid & ~is_cand & ~v_write),
                             meta_resp.ready.eq(take_quiet | take_cand),
                             pending.w_en.eq(take_cand), pending.w_data.eq(Cat(word.center, word.rho))]
                with m.If(take_cand):
                    m.d.sync += candidates.eq(candidates + 1)
                quiet_word = Signal(ml)
                m.d.comb += [quiet_word.center.eq(word.center), quiet_word.rho.eq(word.rho),
                             quiet_word.mode.eq(word.mode), quiet_word.counters.eq(bumped)]
                with m.If(v_write):
                    m.d.comb += [meta.write.valid.eq(1), meta.write.payload.addr.eq(self.verdict.payload.position),
                                 meta.write.payload.data.eq(kept)]
                with m.Elif(take_quiet):
                    m.d.comb += [meta.write.valid.eq(1), meta.write.payload.addr.eq(finished),
                                 meta.write.payload.data.eq(quiet_word)]
                with m.If(take_quiet | take_cand):
                    m.d.sync += finished.eq(finished + 1)
                with m.If((finished == length) & ~pending.r_rdy):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.valid.eq(1)   # its payload, candidates, outside the FSM
                with m.If(self.done.ready):
                    m.next = "IDLE"
        return m
