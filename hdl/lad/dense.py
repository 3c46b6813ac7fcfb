"""Dense PWL attention baseline: every key and value read, LAD's PWL softmax.

Implements golden.dense.dense_attention_bits bit for bit, from the shared VPU and SFM.
A step: the query arrives as ``d/L`` beats (with the context length ``n`` on each);
pass 1 reads every key over the KV port, the VPU's DOT gives each exact score (scaled
to the SFM's x format), kept in a score SRAM, and the running max ``m``; pass 2 reads
each score back, the SFM's EXP gives ``p_i`` (queued in a FIFO) and ``Z += p_i``, while
every value is read and the VPU's AXPY accumulates ``N += p_i v_i`` in registers;
finally the SFM's RECIP of ``Z`` normalises ``N`` into ``o``, streamed as ``d/L`` beats
with the step's statistics (``m``, ``Z``, KV beats read, cycles).
"""
from __future__ import annotations

from amaranth import Array, Module, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.dense import DenseConfig
from golden.sfm import SfmOp
from golden.sram import SramConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, round_shift, saturate
from ..lib.sfm import Sfm
from ..lib.sram import SramBank
from ..lib.vpu import Vpu


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def dense_query_layout(cfg: DenseConfig) -> data.StructLayout:
    return data.StructLayout({"q": data.ArrayLayout(signed(cfg.kv_width), cfg.lanes),
                              "length": unsigned(cfg.position_width)})


def kv_request_layout(cfg: DenseConfig) -> data.StructLayout:
    return data.StructLayout({"value": unsigned(1), "position": unsigned(cfg.position_width),
                              "beat": unsigned(_bits(cfg.beats))})


def kv_response_layout(cfg: DenseConfig) -> data.ArrayLayout:
    return data.ArrayLayout(signed(cfg.kv_width), cfg.lanes)


def dense_out_layout(cfg: DenseConfig) -> data.StructLayout:
    return data.StructLayout({
        "o": data.ArrayLayout(signed(cfg.kv_width), cfg.lanes),
        "m": signed(cfg.sfm.x_width), "z": unsigned(cfg.sfm_out_width_sum),
        "kv_beats": unsigned(32), "cycles": unsigned(32),
    })


class DenseAttention(wiring.Component):
    """``query`` -> (``kv_req`` / ``kv_resp``) -> ``out``; one step at a time."""

    def __init__(self, cfg: DenseConfig):
        self.cfg = cfg
        super().__init__({
            "query": In(stream.Signature(dense_query_layout(cfg))),
            "kv_req": Out(stream.Signature(kv_request_layout(cfg))),
            "kv_resp": In(stream.Signature(kv_response_layout(cfg))),
            "out": Out(stream.Signature(dense_out_layout(cfg))),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        nb, sfm_cfg, vpu_cfg = cfg.beats, cfg.sfm, cfg.vpu
        xw = sfm_cfg.x_width
        m.submodules.vpu = vpu = Vpu(vpu_cfg)
        m.submodules.sfm = sfm = Sfm(sfm_cfg)
        m.submodules.scores = scores = SramBank(SramConfig(depth=cfg.max_positions, width=xw))
        m.submodules.p_fifo = p_fifo = fifo.SyncFIFOBuffered(width=sfm_cfg.value_width, depth=4)
        score_req, score_resp = scores.read_port(0)

        query_buf = Array(Signal(cfg.lanes * cfg.kv_width, name=f"q_beat{b}") for b in range(nb))
        numer = Array(Signal(cfg.lanes * vpu_cfg.acc_width, name=f"numer_beat{b}") for b in range(nb))
        length = Signal(cfg.position_width)
        running_max = Signal(signed(xw))
        z_sum = Signal(cfg.sfm_out_width_sum)
        recip_m, recip_k = Signal(sfm_cfg.value_width), Signal(sfm_cfg.exponent_width)
        kv_beats, cycles = Signal(32), Signal(32)

        load_beat = Signal(range(nb))
        req_pos, req_beat = Signal(cfg.position_width), Signal(range(nb))
        resp_beat = Signal(range(nb))
        done_pos = Signal(cfg.position_width)   # results (scores, or AXPY positions) completed
        done_beat = Signal(range(nb))
        score_pos = Signal(cfg.position_width)  # pass 2: next score to read
        out_beat = Signal(range(nb))
        inflight = Signal(range(nb + 1))         # pass 2: AXPY beats issued, not yet written back

        with m.If(self.kv_req.valid & self.kv_req.ready):
            m.d.sync += kv_beats.eq(kv_beats + 1)

        with m.FSM():
            with m.State("LOAD"):
                m.d.comb += self.query.ready.eq(1)
                with m.If(self.query.valid):
                    m.d.sync += [query_buf[load_beat].eq(self.query.payload.q),
                                 load_beat.eq(incr(load_beat, nb))]
                    with m.If(load_beat == 0):
                        m.d.sync += length.eq(self.query.payload.length)
                    with m.If(load_beat == nb - 1):
                        m.d.sync += [running_max.eq(sfm_cfg.x_format.min_raw), z_sum.eq(0), kv_beats.eq(0),
                                     cycles.eq(0), req_pos.eq(0), req_beat.eq(0), resp_beat.eq(0),
                                     done_pos.eq(0), done_beat.eq(0), score_pos.eq(0)]
                        m.d.sync += [numer[b].eq(0) for b in range(nb)]
                        m.next = "KEYS"

            with m.State("KEYS"):
                m.d.sync += cycles.eq(cycles + 1)
                m.d.comb += [self.kv_req.valid.eq(req_pos < length), self.kv_req.payload.value.eq(0),
                             self.kv_req.payload.position.eq(req_pos), self.kv_req.payload.beat.eq(req_beat)]
                with m.If(self.kv_req.valid & self.kv_req.ready):
                    m.d.sync += req_beat.eq(incr(req_beat, nb))
                    with m.If(req_beat == nb - 1):
                        m.d.sync += req_pos.eq(req_pos + 1)
                # key beats -> VPU DOT with the buffered query beat
                m.d.comb += [vpu.i.valid.eq(self.kv_resp.valid), self.kv_resp.ready.eq(vpu.i.ready),
                             vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(resp_beat == nb - 1)]
                qb = query_buf[resp_beat]
                for l in range(cfg.lanes):
                    m.d.comb += [vpu.i.payload.a[l].eq(self.kv_resp.payload[l]),
                                 vpu.i.payload.b[l].eq(qb[l * cfg.kv_width:(l + 1) * cfg.kv_width].as_signed())]
                with m.If(vpu.i.valid & vpu.i.ready):
                    m.d.sync += resp_beat.eq(incr(resp_beat, nb))
                # scores -> score SRAM, running max
                score = Signal(signed(xw))
                m.d.comb += [vpu.o.ready.eq(1),
                             score.eq(saturate(round_shift(vpu.o.payload.dot * cfg.scale_raw, cfg.score_shift),
                                               signed(xw)))]
                with m.If(vpu.o.valid):
                    m.d.comb += [scores.write.valid.eq(1), scores.write.payload.addr.eq(done_pos),
                                 scores.write.payload.data.eq(score)]
                    m.d.sync += done_pos.eq(done_pos + 1)
                    with m.If(score > running_max):
                        m.d.sync += running_max.eq(score)
                    with m.If(done_pos == length - 1):
                        m.d.sync += [done_pos.eq(0), req_pos.eq(0), req_beat.eq(0), resp_beat.eq(0)]
                        m.next = "VALUES"

            with m.State("VALUES"):
                m.d.sync += cycles.eq(cycles + 1)
                # scores -> x = s - m -> SFM EXP -> p FIFO, Z += p
                m.d.comb += [score_req.valid.eq(score_pos < length), score_req.payload.addr.eq(score_pos)]
                with m.If(score_req.valid & score_req.ready):
                    m.d.sync += score_pos.eq(score_pos + 1)
                x = score_resp.payload.as_signed() - running_max
                m.d.comb += [sfm.i.valid.eq(score_resp.valid), score_resp.ready.eq(sfm.i.ready),
                             sfm.i.payload.op.eq(SfmOp.EXP), sfm.i.payload.x.eq(saturate(x, signed(xw))),
                             p_fifo.w_data.eq(sfm.o.payload.value), p_fifo.w_en.eq(sfm.o.valid),
                             sfm.o.ready.eq(p_fifo.w_rdy)]
                with m.If(sfm.o.valid & sfm.o.ready):
                    m.d.sync += z_sum.eq(z_sum + sfm.o.payload.value)
                # value requests
                m.d.comb += [self.kv_req.valid.eq(req_pos < length), self.kv_req.payload.value.eq(1),
                             self.kv_req.payload.position.eq(req_pos), self.kv_req.payload.beat.eq(req_beat)]
                with m.If(self.kv_req.valid & self.kv_req.ready):
                    m.d.sync += req_beat.eq(incr(req_beat, nb))
                    with m.If(req_beat == nb - 1):
                        m.d.sync += req_pos.eq(req_pos + 1)
                # value beats + p -> VPU AXPY into N; a beat of N is read again only after its
                # update is written back (at most nb - 1 beats in the VPU), whatever its latency
                room = inflight < nb
                both = self.kv_resp.valid & p_fifo.r_rdy & room
                m.d.comb += [vpu.i.valid.eq(both), self.kv_resp.ready.eq(vpu.i.ready & p_fifo.r_rdy & room),
                             p_fifo.r_en.eq(vpu.i.ready & self.kv_resp.valid & room & (resp_beat == nb - 1)),
                             vpu.i.payload.op.eq(VpuOp.AXPY), vpu.i.payload.last.eq(1),
                             vpu.i.payload.scalar.eq(p_fifo.r_data)]
                acc_word = numer[resp_beat]
                aw = vpu_cfg.acc_width
                for l in range(cfg.lanes):
                    m.d.comb += [vpu.i.payload.a[l].eq(self.kv_resp.payload[l]),
                                 vpu.i.payload.acc[l].eq(acc_word[l * aw:(l + 1) * aw].as_signed())]
                with m.If(vpu.i.valid & vpu.i.ready):
                    m.d.sync += resp_beat.eq(incr(resp_beat, nb))
                m.d.sync += inflight.eq(inflight + (vpu.i.valid & vpu.i.ready) - vpu.o.valid)
                m.d.comb += vpu.o.ready.eq(1)
                with m.If(vpu.o.valid):
                    m.d.sync += [numer[done_beat].eq(vpu.o.payload.vec),
                                 done_beat.eq(incr(done_beat, nb))]
                    with m.If(done_beat == nb - 1):
                        m.d.sync += done_pos.eq(done_pos + 1)
                        with m.If(done_pos == length - 1):
                            m.next = "RECIP"

            with m.State("RECIP"):
                m.d.sync += cycles.eq(cycles + 1)
                m.d.comb += [sfm.i.valid.eq(1), sfm.i.payload.op.eq(SfmOp.RECIP), sfm.i.payload.z.eq(z_sum)]
                with m.If(sfm.i.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.sync += cycles.eq(cycles + 1)
                m.d.comb += sfm.o.ready.eq(1)
                with m.If(sfm.o.valid):
                    m.d.sync += [recip_m.eq(sfm.o.payload.value), recip_k.eq(sfm.o.payload.exponent),
                                 out_beat.eq(0)]
                    m.next = "OUTPUT"

            with m.State("OUTPUT"):
                word = numer[out_beat]
                aw = vpu_cfg.acc_width
                m.d.comb += [self.out.valid.eq(1), self.out.payload.m.eq(running_max),
                             self.out.payload.z.eq(z_sum), self.out.payload.kv_beats.eq(kv_beats),
                             self.out.payload.cycles.eq(cycles)]
                for l in range(cfg.lanes):
                    lane = word[l * aw:(l + 1) * aw].as_signed()
                    m.d.comb += self.out.payload.o[l].eq(
                        saturate(round_shift(lane * recip_m, sfm_cfg.mantissa_frac + recip_k), signed(cfg.kv_width)))
                with m.If(self.out.ready):
                    m.d.sync += out_beat.eq(out_beat + 1)
                    with m.If(out_beat == nb - 1):
                        m.next = "LOAD"
        return m
