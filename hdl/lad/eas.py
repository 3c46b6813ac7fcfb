"""EAS: directional centers and approximate scores (docs/algorithms.md §1.4; golden/lad_tile.py steps 1-2).

``start`` runs one step: two VPUs of ``eas_lanes`` lanes (``cfg.eas_vpu``) take ``q.k_n`` (the new
position's exact score) and ``|k_n|^2``, then read every center ``c_j`` once from the centers SRAM,
``eas_lanes`` elements per cycle (a center is ``eas_beats`` words; ``eas_beats`` cycles per center), computing ``q.c_j`` (its scaled score goes to the center-score SRAM) and ``k_n.c_j``
in lockstep; ``t_j = round_shift((k_n.c_j)^2 rc_j, mf + e_j)`` with ``(rc_j, e_j)`` the stored
RECIP of ``|c_j|^2`` picks the best center (first maximum). ``k_n`` joins it when
``t_j 2^16 >= cos^2 |k_n|^2`` (or the table is full), with
``rho = round_shift((k_n.c_j) rc_j, mf + e_j - rho_frac)``; otherwise it becomes a new center
(its RECIP through the ``recip_*`` ports). The result leaves on ``key_out``.
``lookup (center, rho)`` -> ``approx``: ``s^ = sat(round_shift(score_j * rho, rho_frac))``.
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import COS_FRAC, LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, round_shift, saturate
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import recip_resp_layout, score_of, sram_banks, vector_layout


def key_out_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"center": unsigned(cfg.center_width), "rho": signed(cfg.rho_width),
                              "new_center": unsigned(1), "s_new": signed(cfg.sfm.x_width)})


def lookup_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"center": unsigned(cfg.center_width), "rho": signed(cfg.rho_width)})


class Eas(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        super().__init__({
            "q": In(vector_layout(cfg)),
            "k": In(vector_layout(cfg)),
            "start": In(stream.Signature(unsigned(1))),
            "key_out": Out(stream.Signature(key_out_layout(cfg))),
            "lookup": In(stream.Signature(lookup_layout(cfg))),
            "approx": Out(stream.Signature(signed(cfg.sfm.x_width))),
            "recip_req": Out(stream.Signature(unsigned(cfg.sfm.recip_in_width))),
            "recip_resp": In(stream.Signature(recip_resp_layout(cfg))),
            "centers": Out(range(cfg.max_centers + 1)),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        L, nb = cfg.eas_lanes, cfg.eas_beats   # EAS's own beats: eas_lanes elements each
        xw, mf = cfg.sfm.x_width, cfg.sfm.mantissa_frac
        rl = recip_resp_layout(cfg)
        m.submodules.vpu_q = vpu_q = Vpu(cfg.eas_vpu)
        m.submodules.vpu_k = vpu_k = Vpu(cfg.eas_vpu)
        banks = sram_banks(cfg)
        m.submodules.center_mem = cmem = SramBank(banks["eas.centers"])
        m.submodules.score_mem = smem = SramBank(banks["eas.center_scores"])
        m.submodules.recip_mem = rmem = SramBank(banks["eas.center_recips"])
        c_req, c_resp = cmem.read_port(0)
        s_req, s_resp = smem.read_port(0)
        r_req, r_resp = rmem.read_port(0)

        def beat(vec, b):
            return Cat(vec[b * L + i] for i in range(L))

        q_beats = Array(beat(self.q, b) for b in range(nb))
        k_beats = Array(beat(self.k, b) for b in range(nb))
        count = Signal(range(cfg.max_centers + 1))
        m.d.comb += self.centers.eq(count)

        # lookups: score SRAM (latency 1) then the rho multiply; rho travels in a register
        rho_reg = Signal(signed(cfg.rho_width))
        m.d.comb += [s_req.valid.eq(self.lookup.valid), s_req.payload.addr.eq(self.lookup.payload.center),
                     self.lookup.ready.eq(s_req.ready),
                     self.approx.valid.eq(s_resp.valid), s_resp.ready.eq(self.approx.ready),
                     self.approx.payload.eq(saturate(round_shift(s_resp.payload.as_signed() * rho_reg, cfg.rho_frac),
                                                     signed(xw)))]
        with m.If(self.lookup.valid & self.lookup.ready):
            m.d.sync += rho_reg.eq(self.lookup.payload.rho)

        s_new = Signal(signed(xw))
        kk = Signal(cfg.kk_width)
        beat_shape = range(max(nb, 2))        # (at eas_beats = 1 the beat counters stay 0)
        req_j, req_b = Signal(range(cfg.max_centers + 1)), Signal(beat_shape)
        resp_b = Signal(beat_shape)
        done_j = Signal(range(cfg.max_centers + 1))
        best_valid = Signal()
        best_j = Signal(cfg.center_width)
        best_t = Signal(2 * cfg.kk_width + mf + 2)
        best_dot = Signal(signed(cfg.eas_vpu.acc_width))
        best_rc = Signal(rl)
        kdot = Signal(signed(cfg.eas_vpu.acc_width))
        kdot_j = Signal(cfg.center_width)
        write_b = Signal(beat_shape)
        new_rc = Signal(rl)
        result = Signal(key_out_layout(cfg))

        # t_j of each center in a 4-stage pipeline behind its recip's read (it never stalls: one
        # center per cycle at most): the square of k_n.c_j; times rc_j; the shift; the compare.
        # Centers reach the compare in order, so the first maximum wins as in the model.
        m.d.comb += r_resp.ready.eq(1)
        sq_valid, prod_valid, t_valid = Signal(), Signal(), Signal()
        sq = Signal(2 * cfg.eas_vpu.acc_width)
        prod = Signal(2 * cfg.eas_vpu.acc_width + mf + 1)
        t_now = Signal.like(best_t)
        stage_dot = [Signal.like(kdot, name=f"dot_p{i}") for i in range(3)]
        stage_j = [Signal.like(kdot_j, name=f"j_p{i}") for i in range(3)]
        stage_rc = [Signal(rl, name=f"rc_p{i}") for i in range(3)]
        m.d.sync += [sq_valid.eq(r_resp.valid), prod_valid.eq(sq_valid), t_valid.eq(prod_valid),
                     sq.eq(kdot * kdot), prod.eq(sq * stage_rc[0].mantissa),
                     t_now.eq(round_shift(prod, mf + stage_rc[1].exponent)),
                     stage_dot[0].eq(kdot), stage_j[0].eq(kdot_j), stage_rc[0].eq(r_resp.payload)]
        m.d.sync += [x[i + 1].eq(x[i]) for x in (stage_dot, stage_j, stage_rc) for i in range(2)]
        with m.If(t_valid):
            with m.If(~best_valid | (t_now > best_t)):
                m.d.sync += [best_valid.eq(1), best_t.eq(t_now), best_j.eq(stage_j[2]), best_dot.eq(stage_dot[2]),
                             best_rc.eq(stage_rc[2])]
            m.d.sync += done_j.eq(done_j + 1)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.start.ready.eq(1)
                with m.If(self.start.valid):
                    m.d.sync += [req_b.eq(0), resp_b.eq(0), req_j.eq(0), done_j.eq(0), best_valid.eq(0)]
                    m.next = "SELF"
            with m.State("SELF"):   # q.k_n and k_n.k_n, one beat per cycle
                for vpu, other in ((vpu_q, q_beats[req_b]), (vpu_k, k_beats[req_b])):
                    m.d.comb += [vpu.i.valid.eq(1), vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(req_b == nb - 1),
                                 vpu.i.payload.a.eq(k_beats[req_b]), vpu.i.payload.b.eq(other), vpu.o.ready.eq(1)]
                with m.If(vpu_q.i.ready):
                    m.d.sync += req_b.eq(incr(req_b, nb))
                    with m.If(req_b == nb - 1):
                        m.next = "SELF_WAIT"
            with m.State("SELF_WAIT"):
                m.d.comb += [vpu_q.o.ready.eq(1), vpu_k.o.ready.eq(1)]
                with m.If(vpu_q.o.valid):
                    m.d.sync += [s_new.eq(score_of(vpu_q.o.payload.dot, cfg)), kk.eq(vpu_k.o.payload.dot)]
                    m.next = "SCAN"
            with m.State("SCAN"):   # every center: q.c_j and k_n.c_j in lockstep
                m.d.comb += [c_req.valid.eq(req_j < count), c_req.payload.addr.eq(req_j * nb + req_b)]
                with m.If(c_req.valid & c_req.ready):
                    m.d.sync += req_b.eq(incr(req_b, nb))
                    with m.If(req_b == nb - 1):
                        m.d.sync += req_j.eq(req_j + 1)
                for vpu, other in ((vpu_q, q_beats[resp_b]), (vpu_k, k_beats[resp_b])):
                    m.d.comb += [vpu.i.valid.eq(c_resp.valid), vpu.i.payload.op.eq(VpuOp.DOT),
                                 vpu.i.payload.last.eq(resp_b == nb - 1), vpu.i.payload.a.eq(c_resp.payload),
                                 vpu.i.payload.b.eq(other), vpu.o.ready.eq(1)]
                m.d.comb += c_resp.ready.eq(vpu_q.i.ready)
                with m.If(c_resp.valid & c_resp.ready):
                    m.d.sync += resp_b.eq(incr(resp_b, nb))
                # a center's dots: its score to the score SRAM, k_n.c_j waits for the center's recip
                out_j = Signal(range(cfg.max_centers + 1))
                with m.If(vpu_q.o.valid):
                    m.d.comb += [smem.write.valid.eq(1), smem.write.payload.addr.eq(out_j),
                                 smem.write.payload.data.eq(score_of(vpu_q.o.payload.dot, cfg)),
                                 r_req.valid.eq(1), r_req.payload.addr.eq(out_j)]
                    m.d.sync += [kdot.eq(vpu_k.o.payload.dot), kdot_j.eq(out_j), out_j.eq(out_j + 1)]
                with m.If((done_j == count) & ~r_resp.valid & ~vpu_q.o.valid):
                    m.d.sync += out_j.eq(0)
                    m.next = "PRODUCTS"
            kk_cos = Signal(cfg.kk_width + COS_FRAC + 1)
            rho_prod = Signal(signed(len(best_dot) + mf + 2))
            with m.State("PRODUCTS"):   # the decision's two products, registered
                m.d.sync += [kk_cos.eq(kk * cfg.cos2_raw), rho_prod.eq(best_dot * best_rc.mantissa)]
                m.next = "DECIDE"
            with m.State("DECIDE"):
                join = Signal()
                m.d.comb += join.eq(best_valid & (((kk != 0) & ((best_t << COS_FRAC) >= kk_cos))
                                                  | (count >= cfg.max_centers)))
                rho = saturate(round_shift(rho_prod, (best_rc.exponent + (mf - cfg.rho_frac))[:8]),
                               signed(cfg.rho_width))
                with m.If(join):
                    m.d.sync += [result.center.eq(best_j), result.rho.eq(rho), result.new_center.eq(0),
                                 result.s_new.eq(s_new)]
                    m.next = "OUT"
                with m.Else():
                    m.d.sync += [result.center.eq(count), result.rho.eq(1 << cfg.rho_frac), result.new_center.eq(1),
                                 result.s_new.eq(s_new), write_b.eq(0)]
                    m.next = "RECIP"
            with m.State("RECIP"):   # a new center: RECIP(|k_n|^2)
                m.d.comb += [self.recip_req.valid.eq(1), self.recip_req.payload.eq(kk)]
                with m.If(self.recip_req.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.comb += self.recip_resp.ready.eq(1)
                with m.If(self.recip_resp.valid):
                    m.d.sync += new_rc.eq(self.recip_resp.payload)
                    m.next = "WRITE"
            with m.State("WRITE"):   # the key's beats into the centers SRAM, its recip alongside
                m.d.comb += [cmem.write.valid.eq(1), cmem.write.payload.addr.eq(count * nb + write_b),
                             cmem.write.payload.data.eq(k_beats[write_b])]
                m.d.sync += write_b.eq(incr(write_b, nb))
                with m.If(write_b == nb - 1):
                    m.d.comb += [rmem.write.valid.eq(1), rmem.write.payload.addr.eq(count),
                                 rmem.write.payload.data.eq(new_rc)]
                    m.d.sync += count.eq(count + 1)
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.key_out.valid.eq(1), self.key_out.payload.eq(result)]
                with m.If(self.key_out.ready):
                    m.next = "IDLE"
        return m
