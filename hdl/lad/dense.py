"""Dense PWL attention baseline: every key and value read, LAD's PWL softmax.

Implements golden.dense.dense_attention_bits bit for bit, from the shared VPU and SFM.
A step: the query arrives as ``d/L`` beats (the context length ``n`` read with the first);
pass 1 reads every key over the KV port, the VPU's DOT gives each exact score (scaled
to the SFM's x format), kept in a score SRAM, and the running max ``m``; pass 2 reads
each score back, the SFM's EXP gives ``p_i`` (queued in a FIFO) and ``Z += p_i``, while
every value is read and the VPU's AXPY accumulates ``N += p_i v_i`` in a LUT RAM
(the first position's AXPY takes ``acc = 0``, so nothing zeroes ``N``);
finally the SFM's RECIP of ``Z`` normalises ``N`` into ``o``, streamed as ``d/L`` beats
with the step's statistics (``m``, ``Z``, KV beats read, cycles).

Timing (docs/synthesis.md): the score conversion ``sat(round(dot * scale))`` is three
registered stages (partial products; sum with the rounding half; shift and saturate)
between the VPU and the score SRAM / running max; the score SRAM's output is registered
(read latency 2) and ``x = s - m`` is registered before the SFM; the output
``sat(round_shift(N * r, frac + k))`` is a seven-stage pipeline (N's beat and r; partial
products, registered twice; sum with the rounding half; shift in two steps; saturate) that
runs freely into a FIFO holding a step's beats (no stall-all enable); each lane reads its own
registered copy of the shift amount (lane_copies).
"""
from __future__ import annotations

import dataclasses

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.dense import DenseConfig
from golden.sfm import SfmOp
from golden.sram import SramConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, index_width, saturate
from ..lib.pipe import csa_sum, lane_copies, masked_copies, partial_products, placed, register_partials, scaled_round
from ..lib.sfm import Sfm
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import Wires


def dense_query_layout(cfg: DenseConfig) -> data.StructLayout:
    return data.StructLayout({"q": data.ArrayLayout(signed(cfg.kv_width), cfg.lanes),
                              "length": unsigned(cfg.position_width)})


def kv_request_layout(cfg: DenseConfig) -> data.StructLayout:
    return data.StructLayout({"value": unsigned(1), "position": unsigned(cfg.position_width),
                              "beat": unsigned(index_width(cfg.beats))})


def kv_response_layout(cfg: DenseConfig) -> data.ArrayLayout:
    return data.ArrayLayout(signed(cfg.kv_width), cfg.lanes)


def dense_out_layout(cfg: DenseConfig) -> data.StructLayout:
    """A beat of ``o`` with its step's statistics; with ``group`` > 1 also the query head it belongs to."""
    return data.StructLayout({
        "o": data.ArrayLayout(signed(cfg.kv_width), cfg.lanes),
        "m": signed(cfg.sfm.x_width), "z": unsigned(cfg.sfm_out_width_sum),
        "kv_beats": unsigned(32), "cycles": unsigned(32),
        **({"head": unsigned(index_width(cfg.group))} if cfg.group > 1 else {}),
    })


class DenseAttention(wiring.Component):
    """``query`` -> (``kv_req`` / ``kv_resp``) -> ``out``; one step at a time. With ``group`` g > 1
    a step is g queries (head 0's beats first), one stream of KV requests and g outputs in head
    order (``_group``)."""

    def __init__(self, cfg: DenseConfig):
        self.cfg = cfg
        super().__init__({
            "query": In(stream.Signature(dense_query_layout(cfg))),
            "kv_req": Out(stream.Signature(kv_request_layout(cfg))),
            "kv_resp": In(stream.Signature(kv_response_layout(cfg))),
            "out": Out(stream.Signature(dense_out_layout(cfg))),
        })

    def elaborate(self, platform):
        if self.cfg.group > 1:
            return self._group()
        cfg, m = self.cfg, Module()
        nb, sfm_cfg, vpu_cfg = cfg.beats, cfg.sfm, cfg.vpu
        xw = sfm_cfg.x_width
        m.submodules.vpu = vpu = Vpu(vpu_cfg)
        m.submodules.sfm = sfm = Sfm(sfm_cfg)
        m.submodules.scores = scores = SramBank(SramConfig(depth=cfg.max_positions, width=xw,
                                                                   read_latency=2))  # registered BRAM output
        m.submodules.p_fifo = p_fifo = fifo.SyncFIFOBuffered(width=sfm_cfg.value_width, depth=4)
        score_req, score_resp = scores.read_port(0)

        query_buf = Array(Signal(cfg.lanes * cfg.kv_width, name=f"q_beat{b}") for b in range(nb))
        # N, one memory per lane (an acc_width-bit word per beat; LUT RAM, asynchronous reads): the
        # AXPY results write beat done_beat; AXPY reads beat resp_beat as its acc operand, the
        # output pipeline beat out_beat, each lane at its own copy of those counters (below)
        aw = vpu_cfg.acc_width
        numer = [memory.Memory(shape=unsigned(aw), depth=nb, init=[]) for _ in range(cfg.lanes)]
        for l, mem in enumerate(numer):
            m.submodules[f"numer{l}"] = mem
        numer_write = [mem.write_port() for mem in numer]
        numer_acc = [mem.read_port(domain="comb") for mem in numer]
        numer_out = [mem.read_port(domain="comb") for mem in numer]
        length = Signal(cfg.position_width)
        running_max = Signal(signed(xw))
        # running_max one cycle later, read by x = s - m (VALUES, at least two cycles after m's last
        # update) and the output (m): running_max itself only feeds its compare-and-update loop,
        # which its far readers had stretched (the critical path, 92.0 MHz)
        max_copy = Signal(signed(xw))
        m.d.sync += max_copy.eq(running_max)
        z_sum = Signal(cfg.sfm_out_width_sum)
        # likewise Z one cycle later for its far readers, the SFM's RECIP and the output (z): Z's last
        # update comes with the last p, at least the VPU's latency before RECIP
        z_copy = Signal(cfg.sfm_out_width_sum)
        m.d.sync += z_copy.eq(z_sum)
        recip_m = Signal(sfm_cfg.value_width)
        kv_beats, cycles = Signal(32), Signal(32)

        load_beat = Signal(range(nb))
        req_pos, req_beat = Signal(cfg.position_width), Signal(range(nb))
        resp_beat = Signal(range(nb))
        # per lane: copies of resp_beat (N's acc read, the query beat) and out_beat (N's output read),
        # counters updated as the originals, and first_pos (pass 2, the first position's beats:
        # AXPY's acc is 0, not N; cleared at its lane's resp_beat copy): each drives one lane's
        # read logic, not all lanes' (distinct feedback, so yosys does not merge them)
        resp_beat_l = [Signal(range(nb), name=f"resp_beat_l{l}") for l in range(cfg.lanes)]
        out_beat_l = [Signal(range(nb), name=f"out_beat_l{l}") for l in range(cfg.lanes)]
        first_pos_l = [Signal(name=f"first_pos_l{l}") for l in range(cfg.lanes)]
        done_pos = Signal(cfg.position_width)   # results (scores, or AXPY positions) completed
        done_beat = Signal(range(nb))
        # per lane: a copy of done_beat (N's write address), counted as the original: one counter
        # driving every lane's LUT RAM write address took 10.7 ns of routing
        done_beat_l = [Signal(range(nb), name=f"done_beat_l{l}") for l in range(cfg.lanes)]
        # done_pos == length - 1, registered (one cycle behind done_pos: read only at a completed
        # score or a position's last AXPY beat, at least min_beats cycles after done_pos last
        # changed): the compare's carry chain is not in the path to the phase-end resets
        done_last = Signal()
        m.d.sync += done_last.eq(done_pos == length - 1)
        score_pos = Signal(cfg.position_width)  # pass 2: next score to read
        out_beat = Signal(range(nb))
        inflight = Signal(range(nb + 1))         # pass 2: AXPY beats issued, not yet written back

        # pass 1: score = sat(round_shift(dot * scale, score_shift)) in three stages after the VPU
        k_in = Signal()
        k1_valid, k2_valid, k3_valid = Signal(), Signal(), Signal()
        k3_score = scaled_round(m, vpu.o.payload.dot, cfg.scale_raw, cfg.score_shift, signed(xw), "k3_score")
        m.d.sync += [k1_valid.eq(k_in), k2_valid.eq(k1_valid), k3_valid.eq(k2_valid)]
        # pass 2: x = s - m registered before the SFM
        x_valid, x_reg = Signal(), Signal(signed(xw))
        # output: r and the rounding half of its shift s = frac + k (s <= cfg.out_shift_max); N r + half
        # fits cfg.out_sum_width signed bits (golden.dense: |N| <= Z max|v|), so the half always fits
        # and the sum's arithmetic shift is the rounded quotient at every s
        sw = cfg.out_sum_width
        o_half = Signal(cfg.out_shift_max)
        # the shift s (fine_bits low bits, the others: the coarse shift), one copy per lane
        # (lane_copies): read by every bit of a lane's shifters, one register for all lanes had the
        # largest fan-out of the output pipeline (its critical path)
        fine_bits = 3
        shift_bits = cfg.out_shift_max.bit_length()
        o_ctl_load, o_ctl_word = Signal(), Signal(shift_bits)
        o_ctl = lane_copies(m, o_ctl_word, o_ctl_load, cfg.lanes, "o_ctl")
        o_issue, out_issued = Signal(), Signal()
        # the output pipeline runs freely into a FIFO that holds a step's nb beats (empty when OUTPUT
        # starts: the last step's beats have left): out's ready reaches the FIFO, not the enables
        # of the pipeline's every flip-flop (a stall-all enable: the critical path, 91.9 MHz)
        m.submodules.o_fifo = o_fifo = fifo.SyncFIFOBuffered(width=cfg.lanes * cfg.kv_width + 1, depth=nb)
        o_fifo_last = o_fifo.r_data[-1]   # the beat at out is the step's last
        s = Wires(cfg=cfg, nb=nb, sfm_cfg=sfm_cfg, xw=xw, vpu=vpu, sfm=sfm, scores=scores, p_fifo=p_fifo,
                   score_req=score_req, score_resp=score_resp, query_buf=query_buf, aw=aw,
                   numer_write=numer_write, numer_acc=numer_acc, numer_out=numer_out, length=length,
                   running_max=running_max, max_copy=max_copy, z_sum=z_sum, z_copy=z_copy, recip_m=recip_m,
                   kv_beats=kv_beats, cycles=cycles, load_beat=load_beat, req_pos=req_pos, req_beat=req_beat,
                   resp_beat=resp_beat, resp_beat_l=resp_beat_l, out_beat_l=out_beat_l,
                   first_pos_l=first_pos_l, done_pos=done_pos, done_beat=done_beat, done_beat_l=done_beat_l,
                   done_last=done_last, score_pos=score_pos, out_beat=out_beat, inflight=inflight, k_in=k_in,
                   k3_valid=k3_valid, k3_score=k3_score, x_valid=x_valid, x_reg=x_reg, sw=sw, o_half=o_half,
                   fine_bits=fine_bits, shift_bits=shift_bits, o_ctl_load=o_ctl_load, o_ctl_word=o_ctl_word,
                   o_ctl=o_ctl, o_issue=o_issue, out_issued=out_issued, o_fifo=o_fifo,
                   o_fifo_last=o_fifo_last)
        self._operands(m, s)
        with m.FSM():
            self._key_states(m, s)
            self._value_states(m, s)
            self._output_states(m, s)

        self._output_pipeline(m, s)
        return m

    def _operands(self, m, s):
        """The VPU's operands and the payloads and addresses outside the FSM, the query buffer's writes."""
        vpu, kv_beats, cfg, nb, query_buf, req_pos = s.vpu, s.kv_beats, s.cfg, s.nb, s.query_buf, s.req_pos
        req_beat, scores, done_pos, k3_score = s.req_beat, s.scores, s.done_pos, s.k3_score
        score_req, score_pos, sfm, x_reg, z_copy = s.score_req, s.score_pos, s.sfm, s.x_reg, s.z_copy
        p_fifo, numer_write, done_beat_l, resp_beat_l = s.p_fifo, s.numer_write, s.done_beat_l, s.resp_beat_l
        numer_acc, first_pos_l = s.numer_acc, s.first_pos_l
        # the VPU's results are always taken (each phase drains it before the next): its stall-all
        # enable is then constant, not a function of the FSM state fanned out to its every flip-flop
        m.d.comb += vpu.o.ready.eq(1)
        with m.If(self.kv_req.valid & self.kv_req.ready):
            m.d.sync += kv_beats.eq(kv_beats + 1)

        # a query beat is registered (q_in) with its beat's write enable (q_we, one bit per beat) and
        # written into query_buf the next cycle: the handshake (through the harness) then reaches
        # a few flip-flops, not the enables of all nb * lanes * kv_width bits of query_buf. The
        # last beat is written in the first cycle of KEYS, long before its first read. q_we is one
        # copy per lane (masked_copies): each lane's bits of query_buf sit by that lane's VPU
        # multipliers, far apart (one q_we bit driving all lanes' enables: dense's critical path,
        # 10.6 ns of routing)
        q_in, q_we_next = Signal(cfg.lanes * cfg.kv_width), Signal(nb)
        m.d.sync += q_in.eq(self.query.payload.q)
        q_we = masked_copies(m, q_we_next, cfg.lanes, "q_we")
        kw = cfg.kv_width
        for b in range(nb):
            for l in range(cfg.lanes):
                with m.If(q_we[l % len(q_we)][b]):
                    m.d.sync += query_buf[b][l * kw:(l + 1) * kw].eq(q_in[l * kw:(l + 1) * kw])

        # payloads and addresses that need not depend on the state: their consumers look at them only
        # with a valid or an enable (or, the VPU and SFM, only the operands of their op) set in the
        # FSM; assigned outside it, the state decode gates none of their bits
        m.d.comb += [self.kv_req.payload.position.eq(req_pos), self.kv_req.payload.beat.eq(req_beat),
                     scores.write.payload.addr.eq(done_pos), scores.write.payload.data.eq(k3_score),
                     score_req.payload.addr.eq(score_pos), sfm.i.payload.x.eq(x_reg), sfm.i.payload.z.eq(z_copy),
                     p_fifo.w_data.eq(sfm.o.payload.value), vpu.i.payload.scalar.eq(p_fifo.r_data),
                     *(wp.addr.eq(d) for wp, d in zip(numer_write, done_beat_l))]
        # N is written with every VPU result, not only in VALUES: the state decode then does not reach
        # the write enables of all of N's LUT RAM. Exact: in KEYS done_beat is 0 and N's beat 0 is
        # first read by the first position's AXPY, which takes acc = 0 and writes it
        m.d.comb += [wp.en.eq(vpu.o.valid) for wp in numer_write]
        for l in range(cfg.lanes):
            qb = query_buf[resp_beat_l[l]]   # the query beat at resp_beat; acc: N's beat, 0 for the first position
            m.d.comb += [vpu.i.payload.a[l].eq(self.kv_resp.payload[l]),
                         vpu.i.payload.b[l].eq(qb[l * cfg.kv_width:(l + 1) * cfg.kv_width].as_signed()),
                         numer_acc[l].addr.eq(resp_beat_l[l]), numer_write[l].data.eq(vpu.o.payload.vec[l]),
                         vpu.i.payload.acc[l].eq(Mux(first_pos_l[l], 0, numer_acc[l].data.as_signed()))]
        s.add(q_we_next=q_we_next)

    def _key_states(self, m, s):
        """LOAD (the query's beats) and pass 1, KEYS: every key's score into the score SRAM, the
        running max."""
        running_max, sfm_cfg, z_sum, kv_beats = s.running_max, s.sfm_cfg, s.z_sum, s.kv_beats
        cycles, req_pos, req_beat, resp_beat = s.cycles, s.req_pos, s.req_beat, s.resp_beat
        done_pos, done_beat, score_pos, resp_beat_l = s.done_pos, s.done_beat, s.score_pos, s.resp_beat_l
        done_beat_l, q_we_next, load_beat, nb = s.done_beat_l, s.q_we_next, s.load_beat, s.nb
        length, vpu, k_in, k3_valid, scores = s.length, s.vpu, s.k_in, s.k3_valid, s.scores
        k3_score, done_last, first_pos_l = s.k3_score, s.done_last, s.first_pos_l
        with m.State("LOAD"):
            m.d.comb += self.query.ready.eq(1)
            # the step's registers start over in LOAD (nothing reads them there: the last step's
            # output has left), on the state alone, not on the query's handshake
            m.d.sync += [running_max.eq(sfm_cfg.x_format.min_raw), z_sum.eq(0), kv_beats.eq(0),
                         cycles.eq(0), req_pos.eq(0), req_beat.eq(0), resp_beat.eq(0),
                         done_pos.eq(0), done_beat.eq(0), score_pos.eq(0),
                         *(r.eq(0) for r in (*resp_beat_l, *done_beat_l))]
            with m.If(self.query.valid):
                m.d.comb += q_we_next.eq(1 << load_beat)
                m.d.sync += load_beat.eq(incr(load_beat, nb))
                with m.If(load_beat == 0):
                    m.d.sync += length.eq(self.query.payload.length)
                with m.If(load_beat == nb - 1):
                    m.next = "KEYS"

        with m.State("KEYS"):
            m.d.sync += cycles.eq(cycles + 1)
            m.d.comb += [self.kv_req.valid.eq(req_pos < length), self.kv_req.payload.value.eq(0)]
            with m.If(self.kv_req.valid & self.kv_req.ready):
                m.d.sync += req_beat.eq(incr(req_beat, nb))
                with m.If(req_beat == nb - 1):
                    m.d.sync += req_pos.eq(req_pos + 1)
            # key beats -> VPU DOT with the buffered query beat (qb)
            m.d.comb += [vpu.i.valid.eq(self.kv_resp.valid), self.kv_resp.ready.eq(vpu.i.ready),
                         vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(resp_beat == nb - 1)]
            with m.If(vpu.i.valid & vpu.i.ready):
                m.d.sync += [r.eq(incr(r, nb)) for r in (resp_beat, *resp_beat_l)]
            # scores (three stages after the VPU) -> score SRAM, running max
            m.d.comb += k_in.eq(vpu.o.valid)
            with m.If(k3_valid):
                m.d.comb += scores.write.valid.eq(1)
                m.d.sync += done_pos.eq(done_pos + 1)
                with m.If(k3_score > running_max):
                    m.d.sync += running_max.eq(k3_score)
                with m.If(done_last):
                    m.d.sync += [done_pos.eq(0), req_pos.eq(0), req_beat.eq(0), resp_beat.eq(0),
                                 *(r.eq(0) for r in resp_beat_l), *(f.eq(1) for f in first_pos_l)]
                    m.next = "VALUES"

    def _value_states(self, m, s):
        """Pass 2, VALUES: each score's p = EXP(s - m) into Z and the FIFO, N += p v on the VPU."""
        cycles, score_req, score_pos, length = s.cycles, s.score_req, s.score_pos, s.length
        score_resp, max_copy, x_valid, sfm, x_reg = s.score_resp, s.max_copy, s.x_valid, s.sfm, s.x_reg
        xw, p_fifo, z_sum, req_pos, req_beat, nb = s.xw, s.p_fifo, s.z_sum, s.req_pos, s.req_beat, s.nb
        inflight, vpu, resp_beat, resp_beat_l = s.inflight, s.vpu, s.resp_beat, s.resp_beat_l
        first_pos_l, done_beat, done_beat_l, done_pos = s.first_pos_l, s.done_beat, s.done_beat_l, s.done_pos
        done_last = s.done_last
        with m.State("VALUES"):
            m.d.sync += cycles.eq(cycles + 1)
            # scores -> x = s - m -> SFM EXP -> p FIFO, Z += p
            m.d.comb += score_req.valid.eq(score_pos < length)
            with m.If(score_req.valid & score_req.ready):
                m.d.sync += score_pos.eq(score_pos + 1)
            # x = s - m in a register stage between the score SRAM and the SFM
            x = score_resp.payload.as_signed() - max_copy
            m.d.comb += score_resp.ready.eq(~x_valid | sfm.i.ready)
            with m.If(score_resp.ready):
                m.d.sync += [x_valid.eq(score_resp.valid), x_reg.eq(saturate(x, signed(xw)))]
            m.d.comb += [sfm.i.valid.eq(x_valid),
                         sfm.i.payload.op.eq(SfmOp.EXP), p_fifo.w_en.eq(sfm.o.valid),
                         sfm.o.ready.eq(p_fifo.w_rdy)]
            with m.If(sfm.o.valid & sfm.o.ready):
                m.d.sync += z_sum.eq(z_sum + sfm.o.payload.value)
            # value requests
            m.d.comb += [self.kv_req.valid.eq(req_pos < length), self.kv_req.payload.value.eq(1)]
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
                         vpu.i.payload.op.eq(VpuOp.AXPY), vpu.i.payload.last.eq(1)]
            with m.If(vpu.i.valid & vpu.i.ready):
                m.d.sync += [r.eq(incr(r, nb)) for r in (resp_beat, *resp_beat_l)]
                for r, f in zip(resp_beat_l, first_pos_l):
                    with m.If(r == nb - 1):
                        m.d.sync += f.eq(0)
            m.d.sync += inflight.eq(inflight + (vpu.i.valid & vpu.i.ready) - vpu.o.valid)
            # the AXPY results -> beat done_beat of N (the write enable: outside the FSM)
            with m.If(vpu.o.valid):
                m.d.sync += [r.eq(incr(r, nb)) for r in (done_beat, *done_beat_l)]
                with m.If(done_beat == nb - 1):
                    m.d.sync += done_pos.eq(done_pos + 1)
                    with m.If(done_last):
                        m.next = "RECIP"

    def _output_states(self, m, s):
        """RECIP of Z and OUTPUT: N's beats issued into the output pipeline."""
        cycles, sfm, sfm_cfg, o_ctl_load, o_ctl_word = s.cycles, s.sfm, s.sfm_cfg, s.o_ctl_load, s.o_ctl_word
        shift_bits, recip_m, o_half, out_beat = s.shift_bits, s.recip_m, s.o_half, s.out_beat
        out_issued, out_beat_l, o_issue, nb = s.out_issued, s.out_beat_l, s.o_issue, s.nb
        o_fifo_last = s.o_fifo_last
        with m.State("RECIP"):
            m.d.sync += cycles.eq(cycles + 1)
            m.d.comb += [sfm.i.valid.eq(1), sfm.i.payload.op.eq(SfmOp.RECIP)]
            with m.If(sfm.i.ready):
                m.next = "RECIP_WAIT"
        with m.State("RECIP_WAIT"):
            m.d.sync += cycles.eq(cycles + 1)
            m.d.comb += sfm.o.ready.eq(1)
            with m.If(sfm.o.valid):
                out_shift = sfm_cfg.mantissa_frac + sfm.o.payload.exponent
                # the lanes' copies of the shift: in place 2 cycles before the first beat
                # reaches the coarse shift (5 cycles after this one)
                m.d.comb += [o_ctl_load.eq(1), o_ctl_word.eq(out_shift[:shift_bits])]
                m.d.sync += [recip_m.eq(sfm.o.payload.value),
                             o_half.eq((Const(1, 1) << out_shift) >> 1),
                             out_beat.eq(0), out_issued.eq(0), *(r.eq(0) for r in out_beat_l)]
                m.next = "OUTPUT"

        with m.State("OUTPUT"):  # issue the beats into the output pipeline; wait for the last to leave
            m.d.comb += o_issue.eq(~out_issued)
            with m.If(o_issue):
                m.d.sync += [r.eq(incr(r, nb)) for r in (out_beat, *out_beat_l)]
                with m.If(out_beat == nb - 1):
                    m.d.sync += out_issued.eq(1)
            with m.If(self.out.valid & self.out.ready & o_fifo_last):
                m.next = "LOAD"

    def _output_pipeline(self, m, s):
        """The output pipeline: o = sat(round_shift(N r, frac + k)) into the FIFO to ``out``."""
        numer_out, out_beat_l, cfg, aw, recip_m, sw = s.numer_out, s.out_beat_l, s.cfg, s.aw, s.recip_m, s.sw
        o_issue, out_beat, nb, o_half, o_ctl = s.o_issue, s.out_beat, s.nb, s.o_half, s.o_ctl
        fine_bits, o_fifo, max_copy, z_copy = s.fine_bits, s.o_fifo, s.max_copy, s.z_copy
        kv_beats, cycles = s.kv_beats, s.cycles
        # -- output pipeline: N's beat; partial products of N * r, twice; sum with the rounding
        # half; shift (two steps); saturate; the FIFO to ``out``
        m.d.comb += [numer_out[l].addr.eq(out_beat_l[l]) for l in range(cfg.lanes)]   # beat out_beat of N
        o0_valid, o0_last = Signal(), Signal()
        o0_lane = [Signal(signed(aw), name=f"o0_lane{l}") for l in range(cfg.lanes)]
        # N's beat (read from the LUT RAM) and r registered, and the products registered twice (the
        # product registers go into the MULT18X18D, synth/absorb.py); r registered once per lane
        # (masked_copies): one register read by every lane's multipliers took 5.8 ns of routing
        o0_recip = masked_copies(m, recip_m, cfg.lanes, "o0_recip")
        o1_valid, o1_last, o1b_valid, o1b_last = Signal(), Signal(), Signal(), Signal()
        o1_pp = [register_partials(m, 1, partial_products(o0_lane[l], o0_recip[l % len(o0_recip)]), f"o1_{l}")
                 for l in range(cfg.lanes)]
        o1b_pp = [register_partials(m, 1, o1_pp[l], f"o1b_{l}") for l in range(cfg.lanes)]
        o2_valid, o2_last = Signal(), Signal()
        o2_t = [Signal(signed(sw), name=f"o2_t{l}") for l in range(cfg.lanes)]
        m.d.sync += [o0_valid.eq(o_issue), o0_last.eq(out_beat == nb - 1)]
        m.d.sync += [o0_lane[l].eq(numer_out[l].data) for l in range(cfg.lanes)]
        m.d.sync += [o1_valid.eq(o0_valid), o1_last.eq(o0_last), o1b_valid.eq(o1_valid), o1b_last.eq(o1_last),
                     o2_valid.eq(o1b_valid), o2_last.eq(o1b_last)]
        m.d.sync += [o2_t[l].eq(csa_sum(m, placed(o1b_pp[l]) + [o_half], sw, f"o2_{l}").as_signed())
                     for l in range(cfg.lanes)]
        # the shift in two registered steps (by the shift's high bits, then by its low fine_bits
        # bits), then the saturation: an arithmetic shift by a + b is the shift by a, then by b
        o2b_valid, o2b_last, o2c_valid, o2c_last, o3_valid, o3_last = (Signal() for _ in range(6))
        o2b_t = [Signal(signed(sw), name=f"o2b_t{l}") for l in range(cfg.lanes)]
        o2c_t = [Signal(signed(sw), name=f"o2c_t{l}") for l in range(cfg.lanes)]
        o3_o = [Signal(signed(cfg.kv_width), name=f"o3_o{l}") for l in range(cfg.lanes)]
        m.d.sync += [o2b_valid.eq(o2_valid), o2b_last.eq(o2_last), o2c_valid.eq(o2b_valid),
                     o2c_last.eq(o2b_last), o3_valid.eq(o2c_valid), o3_last.eq(o2c_last)]
        for l in range(cfg.lanes):
            fine, coarse = o_ctl[l][:fine_bits], o_ctl[l][fine_bits:]
            m.d.sync += [o2b_t[l].eq(o2_t[l] >> Cat(Const(0, fine_bits), coarse)),
                         o2c_t[l].eq(o2b_t[l] >> fine),
                         o3_o[l].eq(saturate(o2c_t[l], signed(cfg.kv_width)))]
        m.d.comb += [o_fifo.w_en.eq(o3_valid), o_fifo.w_data.eq(Cat(*o3_o, o3_last)),
                     self.out.valid.eq(o_fifo.r_rdy), o_fifo.r_en.eq(self.out.ready)]
        m.d.comb += [self.out.payload.o[l].eq(o_fifo.r_data[l * cfg.kv_width:(l + 1) * cfg.kv_width])
                     for l in range(cfg.lanes)]
        m.d.comb += [self.out.payload.m.eq(max_copy), self.out.payload.z.eq(z_copy),
                     self.out.payload.kv_beats.eq(kv_beats), self.out.payload.cycles.eq(cycles)]

    def _group(self):
        """The group-aware dense block (docs/lad-tile.md, "Dense baseline"): g one-head blocks in
        lockstep on one KV stream. Query beats go to their head's block (head-major); the step's
        length is read with its first beat. The last head's block, the last to start, issues the
        KV requests (the others' identical requests are taken and dropped); each response goes to
        all g blocks at once, when all are ready (their control is the same from then on, as it
        depends on the length and the KV stream alone). The outputs leave in head order, each
        with its head, its own ``m``, ``Z`` and ``kv_beats`` and the group's ``cycles``: those of
        head 0's block, which started g - 1 queries' beats before the last."""
        cfg, m = self.cfg, Module()
        g, nb = cfg.group, cfg.beats
        heads = [DenseAttention(dataclasses.replace(cfg, group=1)) for _ in range(g)]
        for h, head in enumerate(heads):
            m.submodules[f"head{h}"] = head

        in_head, in_beat = Signal(range(g)), Signal(range(nb))
        length = Signal(cfg.position_width)
        first_beat = (in_head == 0) & (in_beat == 0)
        with m.If(self.query.valid & self.query.ready):
            m.d.sync += in_beat.eq(incr(in_beat, nb))
            with m.If(in_beat == nb - 1):
                m.d.sync += in_head.eq(incr(in_head, g))
            with m.If(first_beat):
                m.d.sync += length.eq(self.query.payload.length)
        m.d.comb += self.query.ready.eq(Array(head.query.ready for head in heads)[in_head])
        for h, head in enumerate(heads):
            m.d.comb += [head.query.valid.eq(self.query.valid & (in_head == h)),
                         head.query.payload.q.eq(self.query.payload.q),
                         head.query.payload.length.eq(Mux(first_beat, self.query.payload.length, length))]

        m.d.comb += [self.kv_req.valid.eq(heads[-1].kv_req.valid), self.kv_req.payload.eq(heads[-1].kv_req.payload),
                     heads[-1].kv_req.ready.eq(self.kv_req.ready),
                     *(head.kv_req.ready.eq(1) for head in heads[:-1])]
        all_ready = Cat(*(head.kv_resp.ready for head in heads)).all()
        m.d.comb += self.kv_resp.ready.eq(all_ready)
        for head in heads:
            m.d.comb += [head.kv_resp.valid.eq(self.kv_resp.valid & all_ready),
                         head.kv_resp.payload.eq(self.kv_resp.payload)]

        out_head, out_beat = Signal(range(g)), Signal(range(nb))
        group_cycles = Signal(32)   # head 0's cycles, kept for the later heads' beats (head 0 starts its next step)
        def chosen(field):   # the field of out_head's output
            return Array(Value.cast(getattr(head.out.payload, field)) for head in heads)[out_head]
        m.d.comb += [self.out.valid.eq(Array(head.out.valid for head in heads)[out_head]),
                     *(getattr(self.out.payload, f).eq(chosen(f)) for f in ("o", "m", "z", "kv_beats")),
                     self.out.payload.head.eq(out_head),
                     self.out.payload.cycles.eq(Mux(out_head == 0, heads[0].out.payload.cycles, group_cycles))]
        for h, head in enumerate(heads):
            m.d.comb += head.out.ready.eq(self.out.ready & (out_head == h))
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += out_beat.eq(incr(out_beat, nb))
            with m.If(out_beat == nb - 1):
                m.d.sync += out_head.eq(incr(out_head, g))
            with m.If(out_head == 0):
                m.d.sync += group_cycles.eq(heads[0].out.payload.cycles)
        return m
