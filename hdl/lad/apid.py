"""APID: active-position identification (docs/algorithms.md §1.4; golden/lad_tile.py steps 2 and 4).

Owns the per-position metadata: each position's center and rho (``apid.centers``; the keys'
alone, so one copy for a KV group's heads) and, per query head, its mode and counters
(``apid.modes<h>``), read in lockstep at one address; and a buffer of this step's approximate
scores (a word holds every head's). ``scan`` with ``classify = 0`` (pass A) reads every absorbed
position's metadata, asks EAS for ``s^_i`` (``lookup``/``approx``: one lookup, a score per head),
keeps them and emits each head's maximum on ``smax``. ``classify = 1`` (pass B, with each head's
``m``): ``x^_i = sat(s^_i - m)``; a position inside its guarded mode interval bumps its mode
counter; the others go to the head's MD on ``cand`` without waiting: MD's ``verdict`` (position,
new mode and counters; in candidate order) is written back to the head's modes whenever it comes
(at most ``md_inflight`` candidates in flight per head; a verdict's write takes the head's port
before a quiet position's). The heads take each position in lockstep: a head that has done its
part (its candidate sent or its quiet bump written) waits, flagged, for the others. ``done``
reports each head's candidates once every verdict is back. ``absorb`` writes the new position
(its center and rho; each head's interval as mode, counter 1). One position per cycle where
nothing waits.

With ``group`` 1 the ports carry one head's values; with ``group`` g > 1 ``scan.m``, ``approx``,
``smax``, ``done`` and ``absorb.mode`` carry one per head, and ``cand`` / ``verdict`` are g streams.
"""
from __future__ import annotations

from amaranth import Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig

from ..lib.slice import RegisterSlice
from ..lib.sram import SramBank
from .common import (bump_terms, bumped_counters, candidate_layout, centers_layout, head_scores_shape, head_values,
                     mode_layout, mode_thresholds, per_head, sram_banks)
from .eas import lookup_layout


def scan_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"length": unsigned(cfg.position_width), "m": head_scores_shape(cfg),
                              "classify": unsigned(1)})


def absorb_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"position": unsigned(cfg.position_width), "center": unsigned(cfg.center_width),
                              "rho": signed(cfg.rho_width), "mode": per_head(cfg, unsigned(cfg.sfm.interval_width))})


class Apid(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        g = cfg.group

        def heads(member):   # one stream, or a stream per head
            return member if g == 1 else member.array(g)
        super().__init__({
            "scan": In(stream.Signature(scan_layout(cfg))),
            "lookup": Out(stream.Signature(lookup_layout(cfg))),
            "approx": In(stream.Signature(head_scores_shape(cfg))),
            "smax": Out(stream.Signature(head_scores_shape(cfg))),
            "cand": heads(Out(stream.Signature(candidate_layout(cfg)))),
            "verdict": heads(In(stream.Signature(candidate_layout(cfg)))),
            "done": Out(stream.Signature(per_head(cfg, unsigned(cfg.position_width)))),
            "absorb": In(stream.Signature(absorb_layout(cfg))),
        })

    def _heads(self, port) -> list:
        return [port] if self.cfg.group == 1 else list(port)

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        g, xw, R = cfg.group, cfg.sfm.x_width, cfg.n_intervals
        cl, hl = centers_layout(cfg), mode_layout(cfg)
        cands, verdicts = self._heads(self.cand), self._heads(self.verdict)
        banks = sram_banks(cfg)
        m.submodules.centers_mem = cmem = SramBank(banks["apid.centers"])
        modes = [SramBank(banks[f"apid.modes{h}"]) for h in range(g)]
        for h, bank in enumerate(modes):
            m.submodules[f"modes_mem{h}"] = bank
        m.submodules.approx_mem = amem = SramBank(banks["apid.approx_scores"])
        # the metadata's banks, read in lockstep (same addresses, same cycles): one read is the word
        # centers | head 0's mode and counters | head 1's ...
        reads = [cmem.read_port(0), *(bank.read_port(0) for bank in modes)]
        meta_raw_valid = reads[0][1].valid
        meta_raw_data = Cat(*(resp.payload for _, resp in reads))
        wl = data.StructLayout({"keys": cl, "heads": data.ArrayLayout(hl, g)})
        a_req, a_raw = amem.read_port(0)
        length = Signal(cfg.position_width)
        # The read ports through three register slices, so the decisions neither follow the RAMs'
        # read data nor drive their clock enables: after the first, s^_i against every interval's
        # two thresholds (bound + m, in parallel) and the mode counter's bump terms, per head; after
        # the second, each head's verdict for the position's mode and its bumped counters; the third
        # holds them for the state machine.
        mw = wl.size
        cw = cfg.counter_bits * R
        tests = [mode_thresholds(m, mh, self.scan.valid & self.scan.ready, cfg)
                 for mh in head_values(cfg, self.scan.payload.m)]
        m.submodules.resp_slice = resp_slice = RegisterSlice(mw + xw * g)
        resp = resp_slice.o.payload
        resp_word = data.View(wl, resp[:mw])
        terms = [bump_terms(resp_word.heads[h].counters, resp_word.heads[h].mode, cfg) for h in range(g)]  # a quiet step
        bw = len(terms[0])
        m.submodules.cmp_slice = cmp_slice = RegisterSlice(mw + (bw + 2 * R) * g)
        m.submodules.test_slice = test_slice = RegisterSlice(mw + (1 + cw) * g)
        m.d.comb += [resp_slice.i.valid.eq(meta_raw_valid), resp_slice.i.payload.eq(Cat(meta_raw_data, a_raw.payload)),
                     *(resp.ready.eq(resp_slice.i.ready) for _, resp in reads), a_raw.ready.eq(resp_slice.i.ready)]
        # the tests and terms in a plain register stage before cmp_slice, so the compares' carry
        # chains end at a flip-flop and not in the slice's skid mux
        cmp_valid, cmp_in = Signal(), Signal(mw + (bw + 2 * R) * g)
        cmp_ce = ~cmp_valid | cmp_slice.i.ready
        m.d.comb += [resp_slice.o.ready.eq(cmp_ce), cmp_slice.i.valid.eq(cmp_valid), cmp_slice.i.payload.eq(cmp_in)]
        scores = [resp[mw + h * xw:mw + (h + 1) * xw].as_signed() for h in range(g)]
        with m.If(cmp_ce):
            m.d.sync += [cmp_valid.eq(resp_slice.o.valid),
                         cmp_in.eq(Cat(resp[:mw], *(Cat(t, compare(s)) for t, (compare, _), s in zip(terms, tests, scores))))]
        cmp = cmp_slice.o.payload
        cmp_word = data.View(wl, cmp[:mw])
        verdict_bits = []
        for h, (_, pick) in enumerate(tests):
            part = cmp[mw + h * (bw + 2 * R):mw + (h + 1) * (bw + 2 * R)]
            bumped_raw = bumped_counters(m, part[:bw], cfg, f"quiet_counters{h}")
            verdict_bits.append(Cat(pick(part[bw:], cmp_word.heads[h].mode), bumped_raw))
        m.d.comb += [test_slice.i.valid.eq(cmp_slice.o.valid), cmp_slice.o.ready.eq(test_slice.i.ready),
                     test_slice.i.payload.eq(Cat(cmp[:mw], *verdict_bits))]
        meta_resp = test_slice.o
        word = data.View(wl, test_slice.o.payload[:mw])
        is_cand = [test_slice.o.payload[mw + h * (1 + cw)] for h in range(g)]
        bumped = [data.View(data.ArrayLayout(unsigned(cfg.counter_bits), R),
                            test_slice.o.payload[mw + h * (1 + cw) + 1:mw + (h + 1) * (1 + cw)]) for h in range(g)]

        issued = Signal(cfg.position_width)
        finished = Signal(cfg.position_width)
        best = [Signal(signed(xw), name=f"best{h}") for h in range(g)]
        candidates = [Signal(cfg.position_width, name=f"candidates{h}") for h in range(g)]
        # per head: candidates sent to MD whose verdict is not back yet, and whether the head has
        # done its part of the position at the slices' output (the others have not yet)
        inflight = [Signal(range(cfg.md_inflight + 1), name=f"inflight{h}") for h in range(g)]
        taken = [Signal(name=f"taken{h}") for h in range(g)]

        # pass A's s^_i, taken whenever they come (only APPROX's lookups make them, and APPROX
        # leaves once all are in): EAS's lookup pipeline never stalls on APID's state (APID's
        # state -> approx.ready -> EAS's enables crossed between the blocks)
        m.d.comb += self.approx.ready.eq(1)
        with m.If(self.approx.valid):
            m.d.comb += [amem.write.valid.eq(1), amem.write.payload.addr.eq(finished),
                         amem.write.payload.data.eq(self.approx.payload)]
            m.d.sync += finished.eq(finished + 1)
            for b, a in zip(best, head_values(cfg, self.approx.payload)):
                with m.If(a > b):
                    m.d.sync += b.eq(a)

        # the maxima and the candidate counts, read only while valid (MAX, DONE): their payloads
        # do not decode the state (that decode, gated into each bit, led the tile's compare with m
        # into m's enable: tile 88.0 MHz, seed 2)
        m.d.comb += [self.smax.payload.eq(Cat(*best)), self.done.payload.eq(Cat(*candidates))]
        # the banks' write ports: centers (absorb) and each head's modes (absorb, verdicts, quiet bumps)
        mode_writes = [bank.write for bank in modes]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.scan.ready.eq(1)
                with m.If(self.scan.valid):
                    p = self.scan.payload
                    m.d.sync += [length.eq(p.length), issued.eq(0), finished.eq(0),
                                 *(b.eq(-(1 << (xw - 1))) for b in best), *(c.eq(0) for c in candidates)]
                    with m.If(p.classify):
                        m.next = "CLASSIFY"
                    with m.Else():
                        m.next = "APPROX"
                # the new position's metadata, between steps (the tile never sends a scan with it;
                # ready from the state alone: the tile's state does not reach its own next state here)
                m.d.comb += self.absorb.ready.eq(1)
                with m.If(self.absorb.valid):
                    a = self.absorb.payload
                    keys = Signal(cl)
                    m.d.comb += [keys.center.eq(a.center), keys.rho.eq(a.rho), cmem.write.valid.eq(1),
                                 cmem.write.payload.addr.eq(a.position), cmem.write.payload.data.eq(keys)]
                    for h, (write, mode) in enumerate(zip(mode_writes, head_values(cfg, a.mode))):
                        fresh = Signal(hl, name=f"fresh{h}")
                        m.d.comb += fresh.mode.eq(mode)
                        for r in range(R):
                            m.d.comb += fresh.counters[r].eq(mode == r)
                        m.d.comb += [write.valid.eq(1), write.payload.addr.eq(a.position), write.payload.data.eq(fresh)]

            with m.State("APPROX"):   # pass A: s^_i of every position, and their maximum
                m.d.comb += [req.valid.eq(issued < length) for req, _ in reads]
                m.d.comb += [req.payload.addr.eq(issued) for req, _ in reads]
                with m.If(reads[0][0].valid & reads[0][0].ready):
                    m.d.sync += issued.eq(issued + 1)
                m.d.comb += [self.lookup.valid.eq(meta_resp.valid), self.lookup.payload.center.eq(word.keys.center),
                             self.lookup.payload.rho.eq(word.keys.rho), meta_resp.ready.eq(self.lookup.ready)]
                with m.If(finished == length):
                    m.next = "MAX"
            with m.State("MAX"):
                m.d.comb += self.smax.valid.eq(1)   # its payload, best, outside the FSM
                with m.If(self.smax.ready):
                    m.next = "IDLE"

            with m.State("CLASSIFY"):   # pass B: quiet positions bump their mode, candidates go to MD
                m.d.comb += [*(req.valid.eq(issued < length) for req, _ in reads), a_req.valid.eq(issued < length),
                             *(req.payload.addr.eq(issued) for req, _ in reads), a_req.payload.addr.eq(issued)]
                with m.If(reads[0][0].valid & reads[0][0].ready):
                    m.d.sync += issued.eq(issued + 1)
                acted, v_writes = [], []
                for h in range(g):
                    cand, verdict, write = cands[h], verdicts[h], mode_writes[h]
                    head = word.heads[h]
                    # a verdict is written back as it comes (it has the head's port first)
                    v_write = Signal(name=f"v_write{h}")
                    m.d.comb += [verdict.ready.eq(inflight[h] != 0), v_write.eq(verdict.valid & verdict.ready)]
                    take_quiet, take_cand = Signal(name=f"take_quiet{h}"), Signal(name=f"take_cand{h}")
                    m.d.comb += [cand.valid.eq(meta_resp.valid & is_cand[h] & (inflight[h] != cfg.md_inflight) & ~taken[h]),
                                 cand.payload.position.eq(finished), cand.payload.mode.eq(head.mode),
                                 cand.payload.counters.eq(head.counters),
                                 take_cand.eq(cand.valid & cand.ready),
                                 take_quiet.eq(meta_resp.valid & ~is_cand[h] & ~v_write & ~taken[h])]
                    with m.If(take_cand):
                        m.d.sync += candidates[h].eq(candidates[h] + 1)
                    m.d.sync += inflight[h].eq(inflight[h] + take_cand - v_write)
                    kept, quiet_word = Signal(hl, name=f"kept{h}"), Signal(hl, name=f"quiet_word{h}")
                    m.d.comb += [kept.mode.eq(verdict.payload.mode), kept.counters.eq(verdict.payload.counters),
                                 quiet_word.mode.eq(head.mode), quiet_word.counters.eq(bumped[h])]
                    with m.If(v_write):
                        m.d.comb += [write.valid.eq(1), write.payload.addr.eq(verdict.payload.position),
                                     write.payload.data.eq(kept)]
                    with m.Elif(take_quiet):
                        m.d.comb += [write.valid.eq(1), write.payload.addr.eq(finished), write.payload.data.eq(quiet_word)]
                    acted.append(take_quiet | take_cand)
                    v_writes.append(v_write)
                # the position leaves when every head has done its part (now or flagged before)
                all_done = Cat(*(t | a for t, a in zip(taken, acted))).all()
                m.d.comb += meta_resp.ready.eq(meta_resp.valid & all_done)
                with m.If(meta_resp.ready):
                    m.d.sync += [finished.eq(finished + 1), *(t.eq(0) for t in taken)]
                with m.Else():
                    m.d.sync += [t.eq(t | a) for t, a in zip(taken, acted)]
                with m.If((finished == length) & ~Cat(*(i != 0 for i in inflight)).any()):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.valid.eq(1)   # its payload, the candidate counts, outside the FSM
                with m.If(self.done.ready):
                    m.next = "IDLE"
        return m
