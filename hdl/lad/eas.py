"""EAS: directional centers and approximate scores (docs/algorithms.md §1.4; golden/lad_tile.py steps 1-2).

``start`` runs one step: two VPUs of ``eas_lanes`` lanes (``cfg.eas_vpu``) take ``q.k_n`` (the new
position's exact score) and ``|k_n|^2``, then read every center ``c_j`` once from the centers SRAM,
``eas_lanes`` elements per cycle (a center is ``eas_beats`` words; ``eas_beats`` cycles per center), computing ``q.c_j`` (its scaled score goes to the center-score SRAM) and ``k_n.c_j``
in lockstep; ``t_j = round_shift((k_n.c_j)^2 rc_j, mf + e_j)`` with ``(rc_j, e_j)`` the stored
RECIP of ``|c_j|^2`` picks the best center (first maximum; a running maximum in three registered
steps: compares, verdict, load). ``k_n`` joins it when
``t_j 2^16 >= cos^2 |k_n|^2`` (or the table is full), with
``rho = round_shift((k_n.c_j) rc_j, mf + e_j - rho_frac)``; otherwise it becomes a new center
(its RECIP through the ``recip_*`` ports). The result leaves on ``key_out``.
``lookup (center, rho)`` -> ``approx``: ``s^ = sat(round_shift(score_j * rho, rho_frac))``.
With compact centers (``center_bits``) a center word holds mantissas and the center's exponent: the
VPUs multiply by the mantissas and each dot is shifted by the exponent (``_dots``), a new center's
exponent comes from the key's extremes as it loads (``_key_exponent``) and its rounded mantissas are
written (``_center_write``); docs/lad-tile.md, "Design decisions".
q and k_n arrive beat by beat on ``q_load`` / ``k_load`` before ``start`` (EAS keeps its own copies,
hdl.lad.common.beat_copy).
A KV group's query heads (``group`` g > 1; docs/lad-tile.md, "Compact centers and a tile per KV
group") share the table: ``q_load`` takes each head's query (its ``head`` field), a center is read
once and dotted with every query (g q VPUs beside the k_n one), the score SRAM's word holds the g
heads' scores of a center, a lookup reads it once and multiplies each by the one rho, and
``key_out.s_new`` and ``approx`` carry a score per head (head 0 first).
"""
from __future__ import annotations


from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from golden.lad_tile import COS_FRAC, LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, saturate, stall_all_enable
from ..lib.pipe import (SCALED_STAGES, delayed, greater, partial_products, placed, register_partials,
                        scaled_round, split_add, split_sum)
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import (Wires, beat_copy, beat_load_signature, head_scores_shape, query_load_signature, recip_resp_layout,
                     sram_banks)


def key_out_layout(cfg: LadTileConfig) -> data.StructLayout:
    """The step's key decision and each query head's exact score of the new key, ``s_new``."""
    return data.StructLayout({"center": unsigned(cfg.center_width), "rho": signed(cfg.rho_width),
                              "new_center": unsigned(1), "s_new": head_scores_shape(cfg)})


def center_word_layout(cfg: LadTileConfig) -> data.StructLayout:
    """A word of the centers SRAM: ``eas_lanes`` mantissas of ``center_bits`` and the center's
    exponent (golden.lad_tile.compact_center; none when the center is the key)."""
    return data.StructLayout({"mant": data.ArrayLayout(signed(cfg.center_element_bits), cfg.eas_lanes),
                              "exp": unsigned(cfg.center_exp_width)})


def lookup_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"center": unsigned(cfg.center_width), "rho": signed(cfg.rho_width)})


class Eas(wiring.Component):
    LOOKUP_STAGES = 5   # registers after the score SRAM's read: operands twice, partial products, the sum's halves, the result

    @classmethod
    def lookups_in_flight(cls, cfg: LadTileConfig) -> int:
        """Most lookups taken and not yet answered (the score SRAM's read stages and the above)."""
        return sram_banks(cfg)["eas.center_scores"].read_latency + cls.LOOKUP_STAGES

    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        super().__init__({
            "q_load": In(query_load_signature(cfg)),
            "k_load": In(beat_load_signature(cfg)),
            "start": In(stream.Signature(unsigned(1))),
            "key_out": Out(stream.Signature(key_out_layout(cfg))),
            "lookup": In(stream.Signature(lookup_layout(cfg))),
            "approx": Out(stream.Signature(head_scores_shape(cfg))),
            "recip_req": Out(stream.Signature(unsigned(cfg.sfm.recip_in_width))),
            "recip_resp": In(stream.Signature(recip_resp_layout(cfg))),
            "centers": Out(range(cfg.max_centers + 1)),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        L, nb = cfg.eas_lanes, cfg.eas_beats   # EAS's own beats: eas_lanes elements each
        xw, mf = cfg.sfm.x_width, cfg.sfm.mantissa_frac
        rl = recip_resp_layout(cfg)
        # one q VPU per query head of the group (a center is read once and dotted with every query)
        vpu_q = [Vpu(cfg.eas_vpu, ops=[VpuOp.DOT]) for _ in range(cfg.group)]
        for h, vpu in enumerate(vpu_q):
            m.submodules["vpu_q" if h == 0 else f"vpu_q{h}"] = vpu
        m.submodules.vpu_k = vpu_k = Vpu(cfg.eas_vpu, ops=[VpuOp.DOT])
        banks = sram_banks(cfg)
        m.submodules.center_mem = cmem = SramBank(banks["eas.centers"])
        m.submodules.score_mem = smem = SramBank(banks["eas.center_scores"])
        m.submodules.recip_mem = rmem = SramBank(banks["eas.center_recips"])
        c_req, c_resp = cmem.read_port(0)
        s_req, s_resp = smem.read_port(0)
        r_req, r_resp = rmem.read_port(0)

        # q and k_n, this module's copies (word b: elements b L .. b L + L - 1): q read by the VPUs'
        # operand select, k_n by it and by the center table's write
        q_read = [beat_copy(m, cfg, load, "q_copy" if h == 0 else f"q_copy{h}", L, 1)[0]
                  for h, load in enumerate(self._query_loads(m))]
        k_read, k_write_read = beat_copy(m, cfg, self.k_load, "k_copy", L, 2)
        count = Signal(range(cfg.max_centers + 1))
        m.d.comb += self.centers.eq(count)
        s = Wires(cfg=cfg, nb=nb, xw=xw, mf=mf, rl=rl, vpu_q=vpu_q, vpu_k=vpu_k, banks=banks, cmem=cmem,
                   smem=smem, rmem=rmem, c_req=c_req, c_resp=c_resp, s_req=s_req, s_resp=s_resp, r_req=r_req,
                   r_resp=r_resp, q_read=q_read, k_read=k_read, k_write_read=k_write_read, count=count)
        self._lookups(m, s)
        self._dots(m, s)
        self._key_exponent(m, s)
        self._best_center(m, s)
        self._decision_products(m, s)
        self._scores_and_reads(m, s)
        with m.FSM():
            self._scan_states(m, s)
            self._decision_states(m, s)
            self._new_center_states(m, s)
        return m

    def _query_loads(self, m) -> list:
        """``q_load`` split by query head: each head's beats as a one-head load port."""
        if self.cfg.group == 1:
            return [self.q_load]
        loads = []
        for h in range(self.cfg.group):
            load = beat_load_signature(self.cfg).create(path=(f"q_load_h{h}",))
            m.d.comb += [load.valid.eq(self.q_load.valid & (self.q_load.payload.head == h)),
                         load.payload.beat.eq(self.q_load.payload.beat), load.payload.data.eq(self.q_load.payload.data)]
            loads.append(load)
        return loads

    def _lookups(self, m, s):
        """The lookups' stall-all pipeline: a center's score times rho, from the score SRAM to ``approx``."""
        cfg, banks, s_req, s_resp, xw = s.cfg, s.banks, s.s_req, s.s_resp, s.xw
        # lookups, a stall-all pipeline several deep: the score SRAM's registered read; the operands
        # registered twice (the second copy read only by the DSPs, which synth/absorb.py moves into
        # their input registers: from the FIFO's and the bank's outputs in one register, the route
        # into the DSP column and the multiply were 8.1 ns, lad-eas's limit at 122.8 MHz); their
        # partial products; the sum, rounded and saturated. Each lookup's rho waits in a FIFO for
        # its score.
        lookup_en = stall_all_enable(self.approx)
        m.submodules.rho_fifo = rho_fifo = SyncFIFO(width=cfg.rho_width, depth=banks["eas.center_scores"].read_latency + 1)
        m.d.comb += [s_req.valid.eq(self.lookup.valid & rho_fifo.w_rdy), s_req.payload.addr.eq(self.lookup.payload.center),
                     self.lookup.ready.eq(s_req.ready & rho_fifo.w_rdy),
                     rho_fifo.w_en.eq(self.lookup.valid & self.lookup.ready), rho_fifo.w_data.eq(self.lookup.payload.rho),
                     s_resp.ready.eq(lookup_en), rho_fifo.r_en.eq(s_resp.valid & lookup_en)]
        # (a group's heads: the score word holds every head's score of the center, each times the
        # one rho, in lockstep)
        l_valid = [Signal(name=f"lookup_valid{i}") for i in range(self.LOOKUP_STAGES)]
        l_rho = Signal(signed(cfg.rho_width))
        l_rho_in = Signal.like(l_rho, name="l_rho_in")
        with m.If(lookup_en):
            m.d.sync += [l_valid[0].eq(s_resp.valid), *(l_valid[i + 1].eq(l_valid[i]) for i in range(len(l_valid) - 1)),
                         l_rho_in.eq(rho_fifo.r_data), l_rho.eq(l_rho_in)]
        l_approx = []
        for h in range(cfg.group):
            tag = "" if h == 0 else str(h)
            l_score, approx = Signal(signed(xw), name=f"l_score{tag}"), Signal(signed(xw), name=f"l_approx{tag}")
            l_score_in = Signal.like(l_score, name=f"l_score_in{tag}")
            l_pieces = register_partials(m, lookup_en, partial_products(l_score, l_rho), f"lookup{tag}")
            # the sum in two halves either side of a register (as one carry chain after the pieces'
            # registers, then the shift and the saturation: 108.3 MHz at ecp5-85f)
            l_sum = split_add(m, placed(l_pieces) + [Const(1 << (cfg.rho_frac - 1))], xw + cfg.rho_width + 1,
                              f"lookup{tag}", ce=lookup_en).as_signed()
            with m.If(lookup_en):
                m.d.sync += [l_score_in.eq(s_resp.payload[h * xw:(h + 1) * xw]), l_score.eq(l_score_in),
                             approx.eq(saturate(l_sum >> cfg.rho_frac, signed(xw)))]
            l_approx.append(approx)
        m.d.comb += [self.approx.valid.eq(l_valid[-1]), self.approx.payload.eq(Cat(*l_approx))]

    def _dots(self, m, s):
        """The VPUs' dots as the rest of EAS reads them (``dot_valid``, ``dot_q``, ``dot_k``): a
        compact center's dots are of its mantissas, shifted left by its exponent one register later
        (exactly the dots of ``mant << e``: golden.lad_tile.center_value); a full-width center's are
        the VPUs' own."""
        cfg, vpu_q, vpu_k = s.cfg, s.vpu_q, s.vpu_k
        if not cfg.compact_centers:
            s.add(dot_valid=vpu_q[0].o.valid, dot_q=[vpu.o.payload.dot for vpu in vpu_q], dot_k=vpu_k.o.payload.dot)
            return
        # each operand's exponent (SELF's: 0) as deep as the VPUs (which never stall here)
        exp_in = Signal(cfg.center_exp_width)
        e = exp_in
        for i in range(Vpu.LATENCY):
            e = delayed(m, e, f"dot_exp{i}")
        w = cfg.eas_vpu.acc_width
        dot_valid, dot_k = Signal(), Signal(signed(w))
        dot_q = [Signal(signed(w), name="dot_q" if h == 0 else f"dot_q{h}") for h in range(cfg.group)]
        m.d.sync += [dot_valid.eq(vpu_q[0].o.valid), dot_k.eq(vpu_k.o.payload.dot << e),
                     *(dq.eq(vpu.o.payload.dot << e) for dq, vpu in zip(dot_q, vpu_q))]
        s.add(dot_valid=dot_valid, dot_q=dot_q, dot_k=dot_k, exp_in=exp_in)

    def _key_exponent(self, m, s):
        """``k_exp``: the exponent of k_n as a compact center (golden.lad_tile.compact_center), from
        the largest and smallest element of the step's k beats as they load: k fits at shift ``e``
        iff ``lo 2^e - h_e <= k_l < (hi + 1) 2^e - h_e`` for every l (``h_e`` the rounding half),
        constant bounds, so the exponent is the count of shifts at which the extremes do not fit.
        Each beat's extremes in a registered tree, then running extremes, cleared when the step's
        result leaves (the next step's beats load after it)."""
        cfg = s.cfg
        if not cfg.compact_centers:
            return
        kw, b = cfg.kv_width, cfg.center_element_bits
        kmax, kmin = Signal(signed(kw), init=-(1 << (kw - 1))), Signal(signed(kw), init=(1 << (kw - 1)) - 1)
        valid = delayed(m, self.k_load.valid, "kx_valid")
        beat = delayed(m, self.k_load.payload.data.as_value(), "kx_beat")
        hi_l = lo_l = [beat[i * kw:(i + 1) * kw].as_signed() for i in range(cfg.lanes)]
        level = 0
        while len(hi_l) > 1:          # pairs, a register per level (an odd last lane passes on)
            pairs = [(j, min(j + 1, len(hi_l) - 1)) for j in range(0, len(hi_l), 2)]
            hi_l = [delayed(m, Mux(hi_l[j] > hi_l[i], hi_l[j], hi_l[i]), f"kx_hi{level}_{j}") for j, i in pairs]
            lo_l = [delayed(m, Mux(lo_l[j] < lo_l[i], lo_l[j], lo_l[i]), f"kx_lo{level}_{j}") for j, i in pairs]
            valid = delayed(m, valid, f"kx_valid{level}")
            level += 1
        clear = self.key_out.valid & self.key_out.ready
        with m.If(clear):
            m.d.sync += [kmax.eq(Mux(valid, hi_l[0], kmax.init)), kmin.eq(Mux(valid, lo_l[0], kmin.init))]
        with m.Elif(valid):
            m.d.sync += [kmax.eq(Mux(hi_l[0] > kmax, hi_l[0], kmax)), kmin.eq(Mux(lo_l[0] < kmin, lo_l[0], kmin))]
        lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
        fails = []
        for e in range(kw - b + 1):   # at kw - b + 1 every key fits
            h = (1 << e) >> 1
            fails.append(delayed(m, (kmin < lo * (1 << e) - h) | (kmax >= (hi + 1) * (1 << e) - h), f"kx_fail{e}"))
        k_exp = Signal(cfg.center_exp_width)
        m.d.sync += k_exp.eq(sum(fails))
        s.add(k_exp=k_exp)

    def _best_center(self, m, s):
        """The step's registers and t_j of each center behind its recip's read, into the running
        maximum best_*."""
        xw, cfg, nb, mf, rl, r_resp, banks = s.xw, s.cfg, s.nb, s.mf, s.rl, s.r_resp, s.banks
        s_new = [Signal(signed(xw), name="s_new" if h == 0 else f"s_new{h}") for h in range(cfg.group)]
        kk = Signal(cfg.kk_width)
        beat_shape = range(max(nb, 2))        # (at eas_beats = 1 the beat counters stay 0)
        req_j, req_b = Signal(range(cfg.max_centers + 1)), Signal(beat_shape)
        req_j_next = Signal.like(req_j, init=1, name="req_j_next")   # req_j + 1
        scan_issue = Signal()   # SCAN's reads go on: req_j < count, as a register (the compare and the
                                # state had reached the centers' read enable and req_b: 104.7 MHz)
        self_b = Signal(beat_shape)   # SELF's beat
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

        # t_j of each center behind its recip's read, a pipeline that never stalls (one center a
        # cycle at most): the partial products of (k_n.c_j)^2 (DSPs), registered twice; their sum
        # in two stages; the sum and rc_j copied, their partial products and the rounding half
        # 2^(mf+e_j-1); their sum in two stages; the shift by mf + e_j in two; the compare (in carry
        # chains side by side). Centers reach the compare in order, so the first maximum wins as
        # in the model.
        m.d.comb += r_resp.ready.eq(1)
        dot, dot_j = kdot, kdot_j   # k_n.c_j waits for its recip's read
        for i in range(banks["eas.center_recips"].read_latency - 1):
            dot, dot_j = delayed(m, dot, f"kdot_d{i}"), delayed(m, dot_j, f"kdot_j_d{i}")
        T_STAGES = 12
        t_valid = [Signal(name=f"t_valid{i}") for i in range(T_STAGES)]
        side = data.StructLayout({"dot": signed(cfg.eas_vpu.acc_width), "j": unsigned(cfg.center_width), "rc": rl})
        t_side = [Signal(side, name=f"t_side{i}") for i in range(T_STAGES)]
        m.d.sync += [t_valid[0].eq(r_resp.valid), t_side[0].dot.eq(dot), t_side[0].j.eq(dot_j), t_side[0].rc.eq(r_resp.payload)]
        m.d.sync += [x[i + 1].eq(x[i]) for x in (t_valid, t_side) for i in range(T_STAGES - 1)]
        # registered twice (stages 0, 1): synth/absorb.py moves the first register into the DSPs
        sq_pieces = register_partials(m, 1, register_partials(m, 1, partial_products(dot, dot), "sq"), "sq_f")
        sq = split_sum(m, placed(sq_pieces), 2 * cfg.eas_vpu.acc_width, "sq")                 # stages 2, 3
        # stage 4: both operands of rc_j's multiply copied straight from registers (read only by
        # the DSPs, synth/absorb.py moves them into their input registers)
        sq_op, rc_op = delayed(m, sq, "sq_op"), delayed(m, t_side[3].rc.mantissa, "rc_op")
        # from stage 4 on t_side carries the mantissa inverted: a plain copy would have rc_op's
        # input, and Yosys merges flip-flops with the same input (rc_op must feed only the DSPs)
        m.d.sync += t_side[4].rc.mantissa.eq(~t_side[3].rc.mantissa)
        prod_pieces = register_partials(m, 1, partial_products(sq_op, rc_op), "prod")          # stage 5
        t_half = Signal(2 * cfg.eas_vpu.acc_width + mf + 2)
        m.d.sync += t_half.eq((Const(1, 1) << (mf + t_side[4].rc.exponent)) >> 1)
        prod = split_sum(m, placed(prod_pieces) + [t_half], len(t_half), "prod")              # stages 6, 7
        # the shift by mf + e_j in two steps: by its multiple of 4 (stage 8), then by the rest
        # (stage 9; in one step, its 5-6 mux levels were 9.0 ns, lad-eas's limit at 111.3 MHz)
        t_shift = mf + t_side[7].rc.exponent
        t_coarse, t_fine = Signal.like(prod, name="t_coarse"), Signal(2, name="t_fine")
        m.d.sync += [t_coarse.eq(prod >> Cat(Const(0, 2), t_shift[2:])), t_fine.eq(t_shift[:2])]  # stage 8
        t_now = Signal.like(best_t)
        m.d.sync += t_now.eq(t_coarse >> t_fine)                                                # stage 9
        # the running maximum in three steps (the first maximum wins, as in the model). t_j beats
        # the maximum so far iff it beats every earlier t_i, strictly: stage 10 compares t_j with
        # best_t, which holds the centers three or more cycles ahead, and with the (valid) t of the
        # two cycles just ahead (t_prev1, t_prev2: not in best_* yet), each compare's chunks
        # registered; stage 11 combines them into the verdict (pending_won); stage 12 loads best_*
        # from the center when it won. No compare depends on an earlier verdict, and best_*'s
        # enables come from one flip-flop (with the last verdict choosing between two compares
        # in the verdict's own cycle, 8.3 ns: lad-eas's limit at 120.8 MHz, seed 3; in one step,
        # the compare fanned out to best_*'s enables: 112 MHz).
        t_prev1, t_prev2 = delayed(m, t_now, "t_prev1"), Signal.like(t_now, name="t_prev2")
        m.d.sync += t_prev2.eq(t_prev1)
        beaten = [delayed(m, ~valid, f"{name}_empty") | greater(t_now, t, m=m, name=f"beats_{name}")
                  for name, t, valid in (("best", best_t, best_valid), ("prev1", t_prev1, t_valid[10]),
                                         ("prev2", t_prev2, t_valid[11]))]
        pending_won = Signal()
        m.d.sync += pending_won.eq(t_valid[10] & Cat(beaten).all())
        with m.If(pending_won):   # stage 12: t_j in t_prev2, its side in t_side[11]
            pending = t_side[11]
            m.d.sync += [best_valid.eq(1), best_t.eq(t_prev2), best_j.eq(pending.j), best_dot.eq(pending.dot),
                         best_rc.exponent.eq(pending.rc.exponent), best_rc.mantissa.eq(~pending.rc.mantissa)]
        with m.If(t_valid[11]):    # counted as best_* take the center's verdict
            m.d.sync += done_j.eq(done_j + 1)
        s.add(s_new=s_new, kk=kk, req_j=req_j, req_b=req_b, req_j_next=req_j_next, scan_issue=scan_issue,
              self_b=self_b, done_j=done_j, best_valid=best_valid, best_j=best_j, best_t=best_t,
              best_dot=best_dot, best_rc=best_rc, kdot=kdot, kdot_j=kdot_j, write_b=write_b, new_rc=new_rc,
              result=result)

    def _decision_products(self, m, s):
        """The decision's products: cos^2 |k_n|^2 for the join compare and rho = dot rc of the best center."""
        kk, cfg, best_dot, best_rc, mf, best_t = s.kk, s.cfg, s.best_dot, s.best_rc, s.mf, s.best_t
        # the decision, a state per stage: rho's shift sh from best_rc's exponent (SHIFT); the two
        # products' partials (DSPs, loaded every cycle: here they hold best_*'s) and sh's left/right
        # amounts; their sums (rho's with its rounding half), two stages; the join compare and
        # rho's shift; the choice. rho = sat(round_shift(dot rc, sh)) with
        # sh = e + mf - rho_frac: sh <= 0 shifts left; a right shift of pw - 1 or more gives 0
        # (|dot rc| < 2^(pw - 3)), so it is cut to pw - 1.
        # (kk through a copy read only by the DSPs, which synth/absorb.py moves into their input
        # registers: kk itself also feeds the join's kk != 0 and RECIP, and from the fabric the
        # route into the DSP column and its multiply were 8.2 ns, lad-eas's limit at 121.6 MHz;
        # kk is set in SELF_WAIT, its product read in COMPARE six states later, so one stage more
        # is free. rho's operands through a plain copy of best_*: the compare that loads best_*
        # would otherwise reach the DSPs' clock enables once absorb.py moves best_* into them)
        kk_pieces = register_partials(m, 1, partial_products(delayed(m, kk, "kk_op"), cfg.cos2_raw), "kk_cos")
        rho_dot, rho_mantissa = delayed(m, best_dot, "rho_dot"), delayed(m, best_rc.mantissa, "rho_mantissa")
        rho_pieces = register_partials(m, 1, partial_products(rho_dot, rho_mantissa), "rho")
        pw = len(best_dot) + mf + 3      # dot rc plus its rounding half
        up_max = max(0, cfg.rho_frac - mf)
        sh = Signal(signed(8))    # registered in SHIFT (its add, then the compares below, were 9.1 ns)
        rho_up, rho_down = Signal(range(up_max + 1)), Signal(range(pw))
        rho_half = Signal(pw)
        kk_cos = split_sum(m, placed(kk_pieces), cfg.kk_width + COS_FRAC + 1, "kk_cos")
        rho_prod = split_sum(m, placed(rho_pieces) + [rho_half], pw, "rho_prod").as_signed()
        join = Signal()
        # the join compare's chunks registered (their carry chains end at flip-flops): kk_cos is final
        # by SUMS2 and best_t since SCAN's end, so the verdict of their values a cycle earlier is the
        # same in COMPARE (kk_cos -> the compare -> join across the die: tile 89.46 MHz, seed 1)
        join_above = greater(kk_cos, best_t << COS_FRAC, m=m, name="join_greater")
        rho_raw = Signal(signed(pw + up_max))
        s.add(pw=pw, sh=sh, rho_up=rho_up, rho_down=rho_down, rho_half=rho_half, rho_prod=rho_prod,
              join=join, join_above=join_above, rho_raw=rho_raw)

    def _scores_and_reads(self, m, s):
        """Each dot's scaled score, the banks' addresses, SCAN's reads of the centers and the VPUs'
        operands."""
        cfg, vpu_q, xw, smem, s_new, c_req, req_j = s.cfg, s.vpu_q, s.xw, s.smem, s.s_new, s.c_req, s.req_j
        nb, req_b, r_req, cmem, count, write_b = s.nb, s.req_b, s.r_req, s.cmem, s.count, s.write_b
        k_write_read, rmem, new_rc, vpu_k, c_resp = s.k_write_read, s.rmem, s.new_rc, s.vpu_k, s.c_resp
        scan_issue, req_j_next, self_b, banks = s.scan_issue, s.req_j_next, s.self_b, s.banks
        q_read, k_read, done_j, r_resp, kk, result = s.q_read, s.k_read, s.done_j, s.r_resp, s.kk, s.result
        # the scaled score of each q.k dot (the new key's in SELF_WAIT: s_new; each center's in
        # SCAN: to the score SRAM at its index; common.score_of), registered stages behind the VPU
        score_in, score_in_self = Signal(), Signal()
        out_j = Signal(range(cfg.max_centers + 1))   # the index of the center whose dots leave the VPUs
        # (one per query head; the score SRAM's word holds the group's, head 0 in the low bits)
        score = [scaled_round(m, dq, cfg.scale_raw, cfg.score_shift, signed(xw), "score" if h == 0 else f"score{h}")
                 for h, dq in enumerate(s.dot_q)]
        sc_valid = [Signal(name=f"score_valid{i}") for i in range(SCALED_STAGES)]
        sc_self = [Signal(name=f"score_self{i}") for i in range(SCALED_STAGES)]
        sc_j = [Signal.like(out_j, name=f"score_j{i}") for i in range(SCALED_STAGES)]
        m.d.sync += [sc_valid[0].eq(score_in), sc_self[0].eq(score_in_self), sc_j[0].eq(out_j)]
        m.d.sync += [x[i + 1].eq(x[i]) for x in (sc_valid, sc_self, sc_j) for i in range(SCALED_STAGES - 1)]
        m.d.comb += [smem.write.valid.eq(sc_valid[-1] & ~sc_self[-1]), smem.write.payload.addr.eq(sc_j[-1]),
                     smem.write.payload.data.eq(Cat(*score))]
        with m.If(sc_valid[-1] & sc_self[-1]):
            m.d.sync += [sn.eq(sc) for sn, sc in zip(s_new, score)]
        # the banks' addresses and write data whatever the state (only the valids depend on it): the
        # address and write registers in front of the RAMs then load them without a reset that the
        # state drives (Yosys maps "0 unless the state" to the flip-flops' LSR: 98.5 MHz, the
        # state's decode to the recips' read address reset, 8.3 ns of routing)
        m.d.comb += [c_req.payload.addr.eq(req_j * nb + req_b), r_req.payload.addr.eq(out_j),
                     k_write_read.addr.eq(write_b), rmem.write.payload.addr.eq(count), rmem.write.payload.data.eq(new_rc)]
        self._center_write(m, s)
        # the VPUs' results are always taken (they come only in SELF_WAIT and SCAN, which take them):
        # so they never stall, and their inputs' ready is not a function of the state (it was, through
        # their pipelines' enables: the state -> the enables -> the state, 108.8 MHz); so are the
        # centers' reads (they come only in SCAN, into the VPUs: the state -> their ready -> the
        # bank's output enables, 102.8 MHz)
        m.d.comb += [*(vpu.o.ready.eq(1) for vpu in vpu_q), vpu_k.o.ready.eq(1), c_resp.ready.eq(1)]
        # SCAN's reads of the centers, outside the state machine: scan_issue is set only on entering
        # SCAN and clears at its last read, before SCAN ends, so it is the state's decode as a
        # register. req_b and req_j wrap to 0 after the last read, so they are 0 at every SCAN's
        # start without a reset. (They load the bank's address register, which fans out to every
        # DP16KD: with the state in their enables, the decode crossed the device twice to reach
        # them, 7.1 ns of routing, lad-eas's limit at 111.4 MHz.)
        m.d.comb += c_req.valid.eq(scan_issue)
        with m.If(c_req.valid & c_req.ready):
            m.d.sync += req_b.eq(incr(req_b, nb))
            with m.If(req_b == nb - 1):
                # req_j + 1 kept in its own register, so "another center" is an equality (reads
                # go only while req_j < count, so req_j + 1 <= count), not the add and then a
                # compare in series (two carry chains into scan_issue: 8.4 ns, 119.8 MHz)
                more = req_j_next != count
                m.d.sync += [req_j.eq(Mux(more, req_j_next, 0)), req_j_next.eq(Mux(more, req_j_next + 1, 1)),
                             scan_issue.eq(more)]
        # the VPUs' operands, outside the state machine: a center's beat from the SRAM against q's
        # and k_n's beats of the same index (SCAN), or k_n's beat against them (SELF). Each read's
        # beat index (SCAN: req_b) or SELF's (self_b; one of the two is 0, as they never overlap
        # and both wrap to 0) travels through registers as deep as the read, and q's and k_n's
        # beats of it are picked into registers one cycle before the read's data comes (the read
        # port never stalls: c_resp.ready is 1; nor do the VPUs, whose results are always taken, so
        # their input ready is 1 and SELF feeds one beat a cycle). (Picked in the VPUs' input
        # cycle by a counter of the responses, the 8:1 select reached the VPUs' input registers
        # through 7.3 ns of routing: lad-eas's limit at 111.5 MHz, seed 1.)
        in_self = Signal()
        op_beat, op_self = self_b | req_b, in_self
        for i in range(banks["eas.centers"].read_latency - 1):
            op_beat, op_self = delayed(m, op_beat, f"op_beat{i}"), delayed(m, op_self, f"op_self{i}")
        m.d.comb += [*(qr.addr.eq(op_beat) for qr in q_read), k_read.addr.eq(op_beat)]
        q_op = [delayed(m, qr.data, "q_op" if h == 0 else f"q_op{h}") for h, qr in enumerate(q_read)]
        k_op = delayed(m, k_read.data, "k_op")
        op_last, op_self = delayed(m, op_beat == nb - 1, "op_last"), delayed(m, op_self, "op_self")
        center_lanes = c_resp.payload
        if cfg.compact_centers:   # the mantissas sign-extended to the VPUs' operand width
            word = data.View(center_word_layout(cfg), c_resp.payload)
            lanes = [Signal(signed(cfg.kv_width), name=f"c_lane{i}") for i in range(cfg.eas_lanes)]
            m.d.comb += [lane.eq(x) for lane, x in zip(lanes, word.mant)]
            center_lanes = Cat(*lanes)
            m.d.comb += s.exp_in.eq(Mux(op_self, 0, word.exp))
        for vpu, other in ((vpu_k, k_op), *zip(vpu_q, q_op)):
            m.d.comb += [vpu.i.valid.eq(c_resp.valid | op_self), vpu.i.payload.op.eq(VpuOp.DOT),
                         vpu.i.payload.last.eq(op_last), vpu.i.payload.a.eq(Mux(op_self, k_op, center_lanes)),
                         vpu.i.payload.b.eq(other)]
        # SCAN's end: every center's verdict in best_*, nothing in flight, as a register (from the
        # recips' read valid into the state's enable: 8.5 ns, lad-eas's limit at 117.3 MHz, seed 2)
        scan_drained = Signal()
        m.d.sync += scan_drained.eq((done_j == count) & ~r_resp.valid & ~vpu_q[0].o.valid & ~s.dot_valid & ~Cat(sc_valid).any())
        # outputs read only while valid (RECIP, OUT), driven from their registers outside the FSM: no
        # payload bit decodes the state (a decode gated into every bit sat by the payload's users,
        # far from the FSM it also feeds: the tile's critical paths while the FSM drove them)
        m.d.comb += [self.recip_req.payload.eq(kk), self.key_out.payload.eq(result)]
        s.add(score_in=score_in, score_in_self=score_in_self, out_j=out_j, in_self=in_self,
              scan_drained=scan_drained)

    def _center_write(self, m, s):
        """The new center's words into the centers SRAM while WRITE issues them (``write_issue``): the
        key's word itself, or its compact center (``round_shift(k_l, k_exp)`` per lane: the rounding
        half added, then the shift, each registered, so the write is two cycles behind; ``write_last``
        marks the last word's)."""
        cfg, cmem, count, nb, write_b, k_write_read = s.cfg, s.cmem, s.count, s.nb, s.write_b, s.k_write_read
        issue = Signal(name="write_issue")
        addr = count * nb + write_b
        if not cfg.compact_centers:
            m.d.comb += [cmem.write.valid.eq(issue), cmem.write.payload.addr.eq(addr),
                         cmem.write.payload.data.eq(k_write_read.data)]
            s.add(write_issue=issue)
            return
        kw, e = cfg.kv_width, s.k_exp
        half = Signal(kw, name="write_half")
        m.d.sync += half.eq((Const(1, kw) << e) >> 1)
        rounded = [Signal(signed(kw + 1), name=f"write_rounded{i}") for i in range(cfg.eas_lanes)]
        m.d.sync += [r.eq(k_write_read.data[i * kw:(i + 1) * kw].as_signed() + half) for i, r in enumerate(rounded)]
        word = Signal(center_word_layout(cfg))
        m.d.sync += [*(x.eq(r >> e) for x, r in zip(word.mant, rounded)), word.exp.eq(e)]
        valid1, addr1 = delayed(m, issue, "write_valid1"), delayed(m, addr, "write_addr1")
        last1 = delayed(m, issue & (write_b == nb - 1), "write_last1")
        valid2, addr2, last2 = delayed(m, valid1, "write_valid2"), delayed(m, addr1, "write_addr2"), delayed(m, last1, "write_last2")
        m.d.comb += [cmem.write.valid.eq(valid2), cmem.write.payload.addr.eq(addr2), cmem.write.payload.data.eq(word)]
        s.add(write_issue=issue, write_last=last2)

    def _scan_states(self, m, s):
        """IDLE, SELF (q.k_n and |k_n|^2) and SCAN (every center's dots)."""
        done_j, best_valid, in_self, self_b, nb = s.done_j, s.best_valid, s.in_self, s.self_b, s.nb
        score_in, vpu_q, score_in_self, kk, vpu_k = s.score_in, s.vpu_q, s.score_in_self, s.kk, s.vpu_k
        scan_issue, count, r_req, kdot, kdot_j = s.scan_issue, s.count, s.r_req, s.kdot, s.kdot_j
        out_j, scan_drained = s.out_j, s.scan_drained
        with m.State("IDLE"):
            m.d.comb += self.start.ready.eq(1)
            with m.If(self.start.valid):
                m.d.sync += [done_j.eq(0), best_valid.eq(0)]   # (self_b, req_b, req_j, req_j_next: back at 0, 0, 0, 1, wrapped)
                m.next = "SELF"
        with m.State("SELF"):   # q.k_n and k_n.k_n, one beat per cycle (the operands: above)
            m.d.comb += in_self.eq(1)
            m.d.sync += self_b.eq(incr(self_b, nb))
            with m.If(self_b == nb - 1):
                m.next = "SELF_WAIT"
        with m.State("SELF_WAIT"):
            m.d.comb += [score_in.eq(s.dot_valid), score_in_self.eq(1)]
            with m.If(s.dot_valid):
                m.d.sync += [kk.eq(s.dot_k), scan_issue.eq(count != 0)]
                m.next = "SCAN"
        with m.State("SCAN"):   # every center: q.c_j and k_n.c_j in lockstep (the reads, the operands: above)
            # a center's dots: its score to the score SRAM, k_n.c_j waits for the center's recip
            m.d.comb += score_in.eq(s.dot_valid)
            with m.If(s.dot_valid):
                m.d.comb += r_req.valid.eq(1)
                m.d.sync += [kdot.eq(s.dot_k), kdot_j.eq(out_j), out_j.eq(out_j + 1)]
            with m.If(scan_drained):
                m.d.sync += out_j.eq(0)
                m.next = "SHIFT"

    def _decision_states(self, m, s):
        """The decision, a state per stage: join the best center with rho, or a new center."""
        sh, best_rc, mf, cfg, rho_up, rho_down = s.sh, s.best_rc, s.mf, s.cfg, s.rho_up, s.rho_down
        rho_half, pw, join, best_valid, kk = s.rho_half, s.pw, s.join, s.best_valid, s.kk
        join_above, count, rho_raw, rho_prod, result = s.join_above, s.count, s.rho_raw, s.rho_prod, s.result
        best_j, s_new, write_b = s.best_j, s.s_new, s.write_b
        with m.State("SHIFT"):
            m.d.sync += sh.eq(best_rc.exponent + (mf - cfg.rho_frac))
            m.next = "PRODUCTS"
        with m.State("PRODUCTS"):
            with m.If(sh <= 0):
                m.d.sync += [rho_up.eq(-sh), rho_down.eq(0), rho_half.eq(0)]
            with m.Else():
                down = Mux(sh >= pw - 1, pw - 1, sh[:len(rho_down)])
                m.d.sync += [rho_up.eq(0), rho_down.eq(down), rho_half.eq((Const(1, 1) << down) >> 1)]
            m.next = "SUMS"
        with m.State("SUMS"):       # split_sum's two stages
            m.next = "SUMS2"
        with m.State("SUMS2"):
            m.next = "COMPARE"
        with m.State("COMPARE"):
            m.d.sync += [join.eq(best_valid & (((kk != 0) & ~join_above)
                                               | (count >= cfg.max_centers))),
                         rho_raw.eq((rho_prod << rho_up) >> rho_down)]
            m.next = "DECIDE"
        with m.State("DECIDE"):
            rho = saturate(rho_raw, signed(cfg.rho_width))
            with m.If(join):
                m.d.sync += [result.center.eq(best_j), result.rho.eq(rho), result.new_center.eq(0),
                             result.s_new.eq(Cat(*s_new))]
                m.next = "OUT"
            with m.Else():
                m.d.sync += [result.center.eq(count), result.rho.eq(1 << cfg.rho_frac), result.new_center.eq(1),
                             result.s_new.eq(Cat(*s_new)), write_b.eq(0)]
                m.next = "RECIP"

    def _new_center_states(self, m, s):
        """A new center's RECIP and write into the tables, and the result on ``key_out``."""
        new_rc, cmem, write_b, nb, rmem, count = s.new_rc, s.cmem, s.write_b, s.nb, s.rmem, s.count
        with m.State("RECIP"):   # a new center: RECIP(|k_n|^2)
            m.d.comb += self.recip_req.valid.eq(1)   # its payload, kk, outside the FSM (as AC's)
            with m.If(self.recip_req.ready):
                m.next = "RECIP_WAIT"
        with m.State("RECIP_WAIT"):
            m.d.comb += self.recip_resp.ready.eq(1)
            with m.If(self.recip_resp.valid):
                m.d.sync += new_rc.eq(self.recip_resp.payload)
                m.next = "WRITE"
        compact = self.cfg.compact_centers
        with m.State("WRITE"):   # the key's words into the centers SRAM (_center_write), its recip alongside
            m.d.comb += s.write_issue.eq(1)
            m.d.sync += write_b.eq(incr(write_b, nb))
            with m.If(write_b == nb - 1):
                if compact:
                    m.next = "WRITE_WAIT"
                else:
                    m.d.comb += rmem.write.valid.eq(1)
                    m.d.sync += count.eq(count + 1)
                    m.next = "OUT"
        if compact:
            with m.State("WRITE_WAIT"):   # until the last word is written (its mantissas two stages behind)
                with m.If(s.write_last):
                    m.d.comb += rmem.write.valid.eq(1)
                    m.d.sync += count.eq(count + 1)
                    m.next = "OUT"
        with m.State("OUT"):
            m.d.comb += self.key_out.valid.eq(1)   # its payload, result, outside the FSM
            with m.If(self.key_out.ready):
                m.next = "IDLE"
