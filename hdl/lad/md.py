"""MD: mode discrepancy of candidates (docs/algorithms.md §1.3-1.4; golden/lad_tile.py step 5).

For each candidate from APID: read ``k_i`` over the KV port (``kv_req``/``kv_resp``), the
exact ``x_i = sat(score(q, k_i) - m)`` on one VPU, its interval ``r_i``; bump the counter
of ``r_i`` (the mode's on a false alarm) and return the verdict (mode, counters) to APID;
an active position (``r_i`` differs from the mode) also reads ``v_i`` and sends AC one
``BEATS`` command per beat: ``w_i = round_shift(alpha x_i + (beta << x_frac), exp_shift)``
with ``alpha = a_{r_i} - a*``, ``beta = b_{r_i} - b*``, and the cache update when the mode
changes (counter of ``r_i`` above the mode's). Counts actives, false alarms, mode changes.

Pipelined: MD holds up to ``md_inflight`` candidates (slots, in arrival order). Their key
reads go out back to back; an active's value read goes out as soon as its verdict is given
(before any key read not yet issued), so the KV port streams: a candidate costs its key's
``beats`` requests, an active its value's as well. A tag FIFO routes the in-order responses
(key beats to the VPU, value beats with the kept key beats to AC, through a FIFO of ``2 beats``
corrections; a value read goes out only with room there for its beats, so every response is
taken as it comes). Verdicts leave in candidate order; nothing assumes the VPU's latency. For
the clock (docs/synthesis.md), the exact score goes through a four-stage pipeline after the
VPU (scaled score; ``x``; the boundary compares; ``r``, their count); neither ever stalls (the
scores wait for the decision FSM in a FIFO of ``md_inflight`` entries, one a slot at most),
and ``alpha x`` is registered twice (DSP, fabric) before the one carry chain of ``w``: a
decision takes 6 cycles, under the ``beats`` of its key read. q arrives beat by beat on ``q_load``
(MD keeps its own copy, hdl.lad.common.beat_copy).
"""
from __future__ import annotations

from typing import NamedTuple

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, saturate
from ..lib.pipe import SCALED_STAGES, csa_sum, partial_products, placed, register_partials, scaled_round
from ..lib.vpu import Vpu
from .dense import kv_request_layout
from .common import (AcOp, ac_command_layout, beat_layout, boundary_tests, bump_terms, bump_terms_width, bumped_counters, candidate_layout, interval_count,
                     coef_width, w_width, beat_copy, beat_load_signature, require_one_head)


def _k_index(slot, b, nb):
    """The kept key beat ``b`` of ``slot``'s index in ``k_mem``."""
    return slot * nb + b if nb > 1 else slot


class _Slots(NamedTuple):
    """The slots' registers, kept key beats' ports, FIFOs and allocation, for the parts after them."""
    slot_pos: Array
    slot_mode: Array
    slot_cnt: Array
    slot_w: Array
    slot_alpha: Array
    slot_beta: Array
    slot_change: Array
    k_wp: object
    k_rp: object
    done: list
    head: Signal
    count: Signal
    kptr: Signal
    kpend: Signal
    dptr: Signal
    sbits: int
    vq: SyncFIFO
    tags: SyncFIFO
    alloc: Signal
    free: Signal


class Md(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = require_one_head(cfg)
        super().__init__({
            "q_load": In(beat_load_signature(cfg)),
            "m": In(signed(cfg.sfm.x_width)),
            "cand": In(stream.Signature(candidate_layout(cfg))),
            "verdict": Out(stream.Signature(candidate_layout(cfg))),
            "kv_req": Out(stream.Signature(kv_request_layout(cfg))),
            "kv_resp": In(stream.Signature(beat_layout(cfg))),
            "corr": Out(stream.Signature(ac_command_layout(cfg))),
            "busy": Out(1),
            "active": Out(32), "false_alarms": Out(32), "mode_changes": Out(32),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        L = cfg.lanes
        sfm = cfg.sfm
        cw = coef_width(cfg)
        cl = candidate_layout(cfg)
        cnt_width = cl.members["counters"].size
        m.submodules.vpu = vpu = Vpu(cfg.score_vpu, ops=[VpuOp.DOT])
        q_now, q_next = beat_copy(m, cfg, self.q_load, "q_copy", L, 2)   # q's beats rb and rb + 1
        slopes = Array(Const(v, signed(cw)) for v in sfm.exp_slopes_raw)
        intercepts = Array(Const(v, signed(cw)) for v in sfm.exp_intercepts_raw)
        slots = self._slots(m, cnt_width, cw)
        t_slot, value_done = self._kv_port(m, slots, vpu, q_now, q_next)
        take_score, score_valid, score_x, score_r = self._score_pipeline(m, vpu)
        false_alarm = self._decisions(m, slots, cl, slopes, intercepts, take_score, score_valid, score_x, score_r)
        # a slot is done after its verdict (false alarm) or its value's last beat (active)
        for s in range(cfg.md_inflight):
            with m.If(slots.free & (slots.head == s)):
                m.d.sync += slots.done[s].eq(0)
            with m.If((false_alarm & (slots.dptr == s)) | (value_done & (t_slot == s))):
                m.d.sync += slots.done[s].eq(1)
        return m

    def _slots(self, m, cnt_width, cw):
        """The slots (a ring of candidates in arrival order), their kept key beats, the value-read
        and tag FIFOs, allocation and release."""
        cfg = self.cfg
        L, nb, kw, S = cfg.lanes, cfg.beats, cfg.kv_width, cfg.md_inflight
        sfm = cfg.sfm
        # the slots: a ring of S candidates in arrival order
        slot_pos = Array(Signal(cfg.position_width, name=f"slot{s}_position") for s in range(S))
        slot_mode = Array(Signal(sfm.interval_width, name=f"slot{s}_mode") for s in range(S))
        slot_cnt = Array(Signal(cnt_width, name=f"slot{s}_counters") for s in range(S))
        slot_w = Array(Signal(signed(w_width(cfg)), name=f"slot{s}_w") for s in range(S))
        slot_alpha = Array(Signal(signed(cw), name=f"slot{s}_alpha") for s in range(S))
        slot_beta = Array(Signal(signed(cw), name=f"slot{s}_beta") for s in range(S))
        slot_change = Array(Signal(name=f"slot{s}_change") for s in range(S))
        # the slots' key beats, kept for their corrections (read one cycle ahead of the beat out)
        m.submodules.k_mem = k_mem = memory.Memory(shape=unsigned(L * kw), depth=S * nb, init=[])
        k_wp, k_rp = k_mem.write_port(), k_mem.read_port(domain="sync")
        done = [Signal(name=f"slot{s}_done") for s in range(S)]
        done_arr = Array(done)
        tail, head = Signal(range(S)), Signal(range(S))        # next slot to fill, oldest slot
        count = Signal(range(S + 1))                           # slots in use
        kptr, kpend = Signal(range(S)), Signal(range(S + 1))   # next slot to read the key of; how many wait
        dptr = Signal(range(S))                                # next slot to decide (key dots come in order)

        # value reads to issue (slots, in verdict order) and the tags of the issued reads
        sbits = max(1, (S - 1).bit_length())
        m.submodules.vq = vq = SyncFIFO(width=sbits, depth=S)
        m.submodules.tags = tags = SyncFIFO(width=sbits + 1, depth=2 * S)

        # allocation and release
        alloc, free = Signal(), Signal()
        m.d.comb += [self.cand.ready.eq(count < S), alloc.eq(self.cand.valid & self.cand.ready),
                     free.eq((count != 0) & done_arr[head])]
        with m.If(alloc):
            c = self.cand.payload
            m.d.sync += [slot_pos[tail].eq(c.position), slot_mode[tail].eq(c.mode), slot_cnt[tail].eq(c.counters),
                         tail.eq(incr(tail, S))]
        with m.If(free):
            m.d.sync += head.eq(incr(head, S))
        m.d.sync += count.eq(count + alloc - free)
        return _Slots(slot_pos, slot_mode, slot_cnt, slot_w, slot_alpha, slot_beta, slot_change, k_wp, k_rp,
                      done, head, count, kptr, kpend, dptr, sbits, vq, tags, alloc, free)

    def _kv_port(self, m, slots, vpu, q_now, q_next):
        """The KV port: key and value reads issued a block of beats at a time, their responses
        routed by tags (key beats to the VPU and kept, value beats with the kept key beats to AC's
        corrections); returns the response's slot and the value read's last beat."""
        cfg = self.cfg
        L, nb, kw, S = cfg.lanes, cfg.beats, cfg.kv_width, cfg.md_inflight
        cw = coef_width(cfg)
        vq, tags, sbits, kptr = slots.vq, slots.tags, slots.sbits, slots.kptr
        # issue: one block of nb requests at a time; the next block loads as the last beat goes
        iss_active, iss_value = Signal(), Signal()
        iss_slot, iss_b = Signal(range(S)), Signal(range(nb))
        m.d.comb += [self.kv_req.valid.eq(iss_active), self.kv_req.payload.value.eq(iss_value),
                     self.kv_req.payload.position.eq(slots.slot_pos[iss_slot]), self.kv_req.payload.beat.eq(iss_b)]
        req_fire = Signal()
        m.d.comb += req_fire.eq(self.kv_req.valid & self.kv_req.ready)
        with m.If(req_fire):
            m.d.sync += iss_b.eq(incr(iss_b, nb))
        key_load = Signal()
        # room in the corrections' FIFO (below) for the value beats not yet read out of it
        credits = Signal(range(2 * nb + 1), init=2 * nb)
        m.d.sync += credits.eq(credits - Mux(vq.r_en, nb, 0) + (self.corr.valid & self.corr.ready))
        with m.If(~iss_active | (req_fire & (iss_b == nb - 1))):
            with m.If(vq.r_rdy & tags.w_rdy & (credits >= nb)):      # an active's value first
                m.d.comb += [vq.r_en.eq(1), tags.w_en.eq(1), tags.w_data.eq(Cat(vq.r_data, Const(1, 1)))]
                m.d.sync += [iss_active.eq(1), iss_value.eq(1), iss_slot.eq(vq.r_data)]
            with m.Elif((slots.kpend != 0) & tags.w_rdy):
                m.d.comb += [key_load.eq(1), tags.w_en.eq(1), tags.w_data.eq(Cat(kptr[:sbits] if S > 1 else Const(0, 1),
                                                                                  Const(0, 1)))]
                m.d.sync += [iss_active.eq(1), iss_value.eq(0), iss_slot.eq(kptr), kptr.eq(incr(kptr, S))]
            with m.Else():
                m.d.sync += iss_active.eq(0)
        m.d.sync += slots.kpend.eq(slots.kpend + slots.alloc - key_load)

        # responses, routed by their tags: key beats to the VPU (and kept), value beats to AC
        t_slot, t_value = Signal(range(S)), Signal()
        m.d.comb += [t_slot.eq(tags.r_data[:sbits]), t_value.eq(tags.r_data[sbits])]
        rb = Signal(range(nb))
        q_beat = Signal(L * kw)
        resp_fire = Signal()
        m.d.comb += resp_fire.eq(self.kv_resp.valid & self.kv_resp.ready)
        value_done = Signal()
        m.d.comb += [vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(rb == nb - 1),
                     vpu.i.payload.a.eq(self.kv_resp.payload), vpu.i.payload.b.eq(q_beat)]
        # beat rb of q, registered: both candidates (beat rb and beat rb + 1, looked up from the
        # registered rb) are ready, a response picks one (no 8:1 mux after the response's ready)
        m.d.comb += [q_now.addr.eq(rb), q_next.addr.eq(incr(rb, nb))]
        m.d.sync += q_beat.eq(Mux(resp_fire, q_next.data, q_now.data))
        k_write, k_write_data = Signal(), Signal(L * kw)
        k_write_index = Signal(range(S * nb))
        m.d.sync += k_write.eq(0)
        # corrections: a value beat and its slot's terms are registered as the kept key beat is
        # read (the memory's read register), and go together into a FIFO of 2 beats entries one cycle
        # later. A value read goes out only with room there for its beats (credits, below), so value
        # beats are always taken: AC's ready (through the sequencer) does not reach kv_resp.ready
        cmd = self.corr.payload
        corr_fields = data.StructLayout({"w": signed(w_width(cfg)), "alpha": signed(cw), "beta": signed(cw),
                                         "update": unsigned(1), "v": unsigned(L * kw)})
        c_valid, c = Signal(), Signal(corr_fields)
        m.submodules.corr_q = corr_q = SyncFIFO(width=corr_fields.size + L * kw, depth=2 * nb)
        c_out = data.View(corr_fields, corr_q.r_data[:corr_fields.size])
        m.d.comb += [slots.k_rp.addr.eq(_k_index(t_slot, rb, nb)), slots.k_rp.en.eq(1),
                     corr_q.w_en.eq(c_valid), corr_q.w_data.eq(Cat(c, slots.k_rp.data)),
                     self.corr.valid.eq(corr_q.r_rdy), corr_q.r_en.eq(self.corr.ready),
                     cmd.op.eq(AcOp.BEATS), cmd.accumulate.eq(1), cmd.w.eq(c_out.w), cmd.alpha.eq(c_out.alpha),
                     cmd.beta.eq(c_out.beta), cmd.update.eq(c_out.update), cmd.v.eq(c_out.v),
                     cmd.k.eq(corr_q.r_data[corr_fields.size:])]
        m.d.sync += [c_valid.eq(0), c.w.eq(slots.slot_w[t_slot]), c.alpha.eq(slots.slot_alpha[t_slot]),
                     c.beta.eq(slots.slot_beta[t_slot]), c.update.eq(slots.slot_change[t_slot]),
                     c.v.eq(self.kv_resp.payload)]
        m.d.comb += [self.kv_resp.ready.eq(tags.r_rdy),   # (key beats: the VPU never stalls)
                     self.busy.eq((slots.count != 0) | c_valid | self.corr.valid)]   # a last correction may still wait
        with m.If(tags.r_rdy):
            with m.If(t_value):
                m.d.comb += value_done.eq(resp_fire & (rb == nb - 1))
                m.d.sync += c_valid.eq(self.kv_resp.valid)
            with m.Else():
                m.d.comb += vpu.i.valid.eq(self.kv_resp.valid)
                with m.If(resp_fire):
                    m.d.sync += [k_write.eq(1), k_write_index.eq(_k_index(t_slot, rb, nb)),
                                 k_write_data.eq(self.kv_resp.payload)]
        # a key beat is kept one cycle after it arrives (registered index and data: the kept
        # words' enables do not follow the response's ready); its value read comes after its verdict
        m.d.comb += [slots.k_wp.en.eq(k_write), slots.k_wp.addr.eq(k_write_index), slots.k_wp.data.eq(k_write_data)]
        with m.If(resp_fire):
            m.d.sync += rb.eq(incr(rb, nb))
            with m.If(rb == nb - 1):
                m.d.comb += tags.r_en.eq(1)
        return t_slot, value_done

    def _score_pipeline(self, m, vpu):
        """The exact score's pipeline after the VPU (scaled score, x, the boundary compares, r) and
        the FIFO the scores wait in for the decisions; returns (take, valid, x, r) at its head."""
        cfg = self.cfg
        sfm, S = cfg.sfm, cfg.md_inflight
        xw = sfm.x_width
        # the score pipeline: the VPU's dot -> the
        # partial products of dot * scale -> their sum with the rounding half -> the scaled score
        # (shifted and saturated, as score_of) -> x = sat(score - m) -> its interval r, one carry
        # chain per stage
        take_score = Signal()           # the decision FSM takes (x, r)
        SP_STAGES = SCALED_STAGES + 3
        sp_valid = [Signal(name=f"score{i}_valid") for i in range(SP_STAGES)]
        sp_x1, sp_x2, sp_x = (Signal(signed(xw), name=n) for n in ("sp_x1", "sp_x2", "sp_x"))
        sp_below = Signal(len(cfg.sfm.exp_boundaries_raw))   # boundary_tests of x
        sp_r = Signal(sfm.interval_width)
        # the VPU and the score pipeline never stall (vpu.o.ready = 1): each score in flight belongs
        # to a slot not yet decided, so at most S of them wait, in a FIFO of S entries after the
        # pipeline. Nothing downstream (the decision FSM) reaches the VPU's enable or kv_resp.ready
        # (score5_valid -> VPU o.ready -> its i.ready -> kv_resp.ready -> the q-beat select crossed
        # the die twice: the tile's critical path, 88 % routing). The FSM reads the FIFO's head,
        # or the last stage straight through when the FIFO is empty (no latency added).
        m.submodules.scores = scores = SyncFIFO(width=xw + sfm.interval_width, depth=S)
        m.d.comb += vpu.o.ready.eq(1)
        score_valid = scores.r_rdy | sp_valid[-1]
        fifo_x, fifo_r = scores.r_data[:xw].as_signed(), scores.r_data[xw:]
        score_x, score_r = Mux(scores.r_rdy, fifo_x, sp_x), Mux(scores.r_rdy, fifo_r, sp_r)
        m.d.comb += [scores.r_en.eq(take_score),
                     scores.w_en.eq(sp_valid[-1] & ~(take_score & ~scores.r_rdy)), scores.w_data.eq(Cat(sp_x, sp_r))]
        sp_score = scaled_round(m, vpu.o.payload.dot, cfg.scale_raw, cfg.score_shift, signed(xw), "sp_score")
        m.d.sync += [sp_valid[0].eq(vpu.o.valid), *(sp_valid[i + 1].eq(sp_valid[i]) for i in range(SP_STAGES - 1)),
                     sp_x1.eq(saturate(sp_score - self.m, signed(xw))),
                     sp_x2.eq(sp_x1), sp_below.eq(boundary_tests(sp_x1, cfg)),
                     sp_x.eq(sp_x2), sp_r.eq(interval_count(sp_below))]
        return take_score, score_valid, score_x, score_r

    def _decisions(self, m, slots, cl, slopes, intercepts, take_score, score_valid, score_x, score_r):
        """The decision FSM, one candidate at a time in slot order: interval, counters, weight,
        verdict, the active's correction terms; returns its false-alarm flag."""
        cfg = self.cfg
        sfm, S = cfg.sfm, cfg.md_inflight
        xw, cw = sfm.x_width, coef_width(cfg)
        dptr, vq = slots.dptr, slots.vq
        # decisions, one candidate at a time in slot order
        mode = Signal(sfm.interval_width)
        x = Signal(signed(xw))
        r = Signal(sfm.interval_width)
        change = Signal()
        alpha, beta = Signal(signed(cw), name="alpha"), Signal(signed(cw), name="beta")
        # the tables' entries at r and at the slot's mode, looked up as r and mode load (SCORE):
        # DECIDE subtracts registers (mode -> slopes[mode] -> the subtraction's carry chain was
        # lad-md's critical path, 12 levels)
        slope_r, slope_mode = Signal(signed(cw), name="slope_r"), Signal(signed(cw), name="slope_mode")
        intercept_r, intercept_mode = Signal(signed(cw), name="intercept_r"), Signal(signed(cw), name="intercept_mode")
        w = Signal(signed(w_width(cfg)))
        terms = Signal(bump_terms_width(cfg))   # bump_terms, registered with r (SCORE)
        bumped = bumped_counters(m, terms, cfg, "md_counters")
        # change is read first in VERDICT: the two bumped counters it compares are looked up in
        # DECIDE and compared in PRODUCT (in one cycle, terms -> halving -> look-ups -> compare
        # was lad-md's critical path once DECIDE's table look-ups had moved)
        bumped_r = Signal(cfg.counter_bits, name="bumped_r")
        bumped_mode = Signal(cfg.counter_bits, name="bumped_mode")
        false_alarm = Signal()
        # alpha x registered twice: in the MULT18X18D (synth/absorb.py), then in the fabric
        ax_pp = register_partials(m, 1, register_partials(m, 1, partial_products(alpha, x), "ax"), "ax_f")
        ww_full = cw + xw + 2      # alpha x + (beta << x_frac) + half, exact
        half = (1 << (sfm.exp_shift - 1)) if sfm.exp_shift > 0 else 0
        wsum = csa_sum(m, placed(ax_pp) + [beta << sfm.x_frac, Const(half)], ww_full, "wsum")
        with m.FSM():
            with m.State("SCORE"):
                m.d.comb += take_score.eq(1)
                with m.If(score_valid):
                    m.d.sync += [x.eq(score_x), r.eq(score_r), mode.eq(slots.slot_mode[dptr]),
                                 terms.eq(bump_terms(data.View(cl.members["counters"], slots.slot_cnt[dptr]), score_r, cfg)),
                                 slope_r.eq(slopes[score_r]), slope_mode.eq(slopes[slots.slot_mode[dptr]]),
                                 intercept_r.eq(intercepts[score_r]), intercept_mode.eq(intercepts[slots.slot_mode[dptr]])]
                    m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.sync += [alpha.eq(slope_r - slope_mode), beta.eq(intercept_r - intercept_mode),
                             bumped_r.eq(bumped[r]), bumped_mode.eq(bumped[mode])]
                m.next = "PRODUCT"
            with m.State("PRODUCT"):    # alpha x in the DSP's register
                m.d.sync += change.eq((r != mode) & (bumped_r > bumped_mode))
                m.next = "PRODUCT_FABRIC"
            with m.State("PRODUCT_FABRIC"):
                m.next = "WEIGHT"
            with m.State("WEIGHT"):     # round_shift(alpha x + (beta << x_frac), exp_shift), one carry chain
                m.d.sync += w.eq(wsum.as_signed() >> sfm.exp_shift if sfm.exp_shift > 0 else wsum.as_signed() << -sfm.exp_shift)
                m.next = "VERDICT"
            with m.State("VERDICT"):
                m.d.comb += [self.verdict.valid.eq(1), self.verdict.payload.position.eq(slots.slot_pos[dptr]),
                             self.verdict.payload.mode.eq(Mux(change, r, mode)),
                             self.verdict.payload.counters.eq(bumped)]
                with m.If(self.verdict.ready):
                    m.d.sync += dptr.eq(incr(dptr, S))
                    with m.If(r == mode):
                        m.d.comb += false_alarm.eq(1)
                        m.d.sync += self.false_alarms.eq(self.false_alarms + 1)
                    with m.Else():
                        m.d.comb += [vq.w_en.eq(1), vq.w_data.eq(dptr)]
                        m.d.sync += [self.active.eq(self.active + 1), slots.slot_w[dptr].eq(w),
                                     slots.slot_alpha[dptr].eq(alpha), slots.slot_beta[dptr].eq(beta),
                                     slots.slot_change[dptr].eq(change)]
                        with m.If(change):
                            m.d.sync += self.mode_changes.eq(self.mode_changes + 1)
                    m.next = "SCORE"
        return false_alarm
