"""MD: mode discrepancy of candidates (docs/algorithms.md §1.3-1.4; golden/lad_tile.py step 5).

For each candidate from APID: read ``k_i`` over the KV port (``kv_req``/``kv_resp``), the
exact ``x_i = sat(score(q, k_i) - m)`` on one VPU, its interval ``r_i``; bump the counter
of ``r_i`` (the mode's on a false alarm) and return the verdict (mode, counters) to APID;
an active position (``r_i`` differs from the mode) also reads ``v_i`` and sends AC one
``BEATS`` command per beat: ``w_i = round_shift(alpha x_i + (beta << x_frac), exp_shift)``
with ``alpha = a_{r_i} - a*``, ``beta = b_{r_i} - b*``, and the cache update when the mode
changes (counter of ``r_i`` above the mode's). Counts actives, false alarms, mode changes.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, round_shift, saturate
from ..lib.vpu import Vpu
from .dense import kv_request_layout
from .common import (W_WIDTH, AcOp, ac_command_layout, beat_layout, bump_counters, candidate_layout, interval_of,
                     score_of, vector_layout)


class Md(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        super().__init__({
            "q": In(vector_layout(cfg)),
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
        L, nb, kw = cfg.lanes, cfg.beats, cfg.kv_width
        sfm = cfg.sfm
        xw, cw = sfm.x_width, sfm.coef_frac + 2
        m.submodules.vpu = vpu = Vpu(cfg.score_vpu)
        q_beats = Array(Cat(self.q[b * L + i] for i in range(L)) for b in range(nb))
        k_buf = Array(Signal(L * kw, name=f"k_beat{b}") for b in range(nb))
        slopes = Array(Const(v, signed(cw)) for v in sfm.exp_slopes_raw)
        intercepts = Array(Const(v, signed(cw)) for v in sfm.exp_intercepts_raw)

        position = Signal(cfg.position_width)
        mode = Signal(sfm.interval_width)
        counters = Signal(candidate_layout(cfg).members["counters"])
        x = Signal(signed(xw))
        r = Signal(sfm.interval_width)
        req_b, resp_b = Signal(range(nb + 1)), Signal(range(nb))
        change = Signal()
        alpha, beta = Signal(signed(cw)), Signal(signed(cw))
        w = Signal(signed(W_WIDTH))

        bumped = bump_counters(m, counters, r, cfg, "md_counters")
        m.d.comb += self.kv_req.payload.position.eq(position)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cand.ready.eq(1)
                with m.If(self.cand.valid):
                    c = self.cand.payload
                    m.d.sync += [position.eq(c.position), mode.eq(c.mode), counters.eq(c.counters),
                                 req_b.eq(0), resp_b.eq(0)]
                    m.next = "KEY"
            with m.State("KEY"):   # k_i beats -> DOT with q (and kept for a cache update)
                m.d.comb += self.busy.eq(1)
                m.d.comb += [self.kv_req.valid.eq(req_b < nb), self.kv_req.payload.value.eq(0),
                             self.kv_req.payload.beat.eq(req_b)]
                with m.If(self.kv_req.valid & self.kv_req.ready):
                    m.d.sync += req_b.eq(req_b + 1)
                m.d.comb += [vpu.i.valid.eq(self.kv_resp.valid), self.kv_resp.ready.eq(vpu.i.ready),
                             vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(resp_b == nb - 1),
                             vpu.i.payload.a.eq(self.kv_resp.payload), vpu.i.payload.b.eq(q_beats[resp_b]),
                             vpu.o.ready.eq(1)]
                with m.If(self.kv_resp.valid & self.kv_resp.ready):
                    m.d.sync += [k_buf[resp_b].eq(self.kv_resp.payload), resp_b.eq(incr(resp_b, nb))]
                with m.If(vpu.o.valid):
                    xv = saturate(score_of(vpu.o.payload.dot, cfg) - self.m, signed(xw))
                    m.d.sync += [x.eq(xv), r.eq(interval_of(xv, cfg))]
                    m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [alpha.eq(slopes[r] - slopes[mode]), beta.eq(intercepts[r] - intercepts[mode]),
                             change.eq((r != mode) & (bumped[r] > bumped[mode]))]
                m.next = "WEIGHT"
            with m.State("WEIGHT"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += w.eq(round_shift(alpha * x + (beta << sfm.x_frac), sfm.exp_shift))
                m.next = "VERDICT"
            with m.State("VERDICT"):
                m.d.comb += [self.busy.eq(1), self.verdict.valid.eq(1), self.verdict.payload.position.eq(position),
                             self.verdict.payload.mode.eq(Mux(change, r, mode)),
                             self.verdict.payload.counters.eq(bumped)]
                with m.If(self.verdict.ready):
                    m.d.sync += req_b.eq(0)
                    with m.If(r == mode):
                        m.d.sync += self.false_alarms.eq(self.false_alarms + 1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += self.active.eq(self.active + 1)
                        with m.If(change):
                            m.d.sync += self.mode_changes.eq(self.mode_changes + 1)
                        m.next = "VALUE"
            with m.State("VALUE"):   # v_i beats -> AC, with the kept k_i beats
                m.d.comb += self.busy.eq(1)
                m.d.comb += [self.kv_req.valid.eq(req_b < nb), self.kv_req.payload.value.eq(1),
                             self.kv_req.payload.beat.eq(req_b)]
                with m.If(self.kv_req.valid & self.kv_req.ready):
                    m.d.sync += req_b.eq(req_b + 1)
                cmd = self.corr.payload
                m.d.comb += [self.corr.valid.eq(self.kv_resp.valid), self.kv_resp.ready.eq(self.corr.ready),
                             cmd.op.eq(AcOp.BEATS), cmd.w.eq(w), cmd.alpha.eq(alpha), cmd.beta.eq(beta),
                             cmd.accumulate.eq(1), cmd.update.eq(change), cmd.k.eq(k_buf[resp_b]),
                             cmd.v.eq(self.kv_resp.payload)]
                with m.If(self.corr.valid & self.corr.ready):
                    m.d.sync += resp_b.eq(incr(resp_b, nb))
                    with m.If(resp_b == nb - 1):
                        m.next = "IDLE"
        return m
