"""MAC decode engine: one MAC-Attention decode step of one query head (docs/mac-unit.md,
"Decode engine"; docs/algorithms.md §2), bit for bit ``golden.mac_decode.MacDecodeHead``.

Streams: ``query`` (``d/L`` beats of head, position n, the step's ``reuse`` bit, pre-RoPE and
post-RoPE query lanes; ``reuse = 0``, a layer in ``full_layers``, makes the step a miss);
``kv_req`` (head, K or V, first position, count) / ``kv_resp`` (``count·d/L`` beats of
``lanes`` elements, in order); ``es_req`` (write bit, head, slot, beat and, for a write, the
beat's m, s, o lanes) / ``es_resp`` (m, s, o lanes of a read beat; a write has no response);
``out`` (``d/L`` beats of m, s, o lanes with ``stats = 0``, then one statistics beat with
``stats = 1``: engaged, hit, matched position and distance, fallback, keys read, cycles: the
step's, less those with ``out`` stalled).

A step, in order (one thing at a time; the schedule ``golden.mac_decode.head_step_cycles``
models is the target, not yet reached):

1. The pre-RoPE query beats go straight into the :class:`~hdl.mac.match.MatchUnit` (its ring is
   written on every step; while ``L < min_context`` or ``reuse`` (the config's or the step's) is off
   the step goes on without waiting and the result is dropped),
   the post-RoPE beats into a query buffer. Then ``F``, ``lo_tail``, ``lo_band`` and the keys read.
2. **K pass**: one KV burst for the sinks ``[0, F)`` and one for ``[lo, L)`` (``lo = lo_band`` on a
   hit, ``F`` on a miss); the VPU's DOT gives each exact ``q·k``, three registered stages give
   ``sat(round_shift(q·k · scale, score_shift))`` into the score SRAM (addressed by position), and
   the running maxima of the sinks, the middle range (band / prefix) and the tail.
3. **Range attention** (``attend_bits``) of a range ``[lo, hi)`` with its maximum ``m``: one V
   burst; each score read back, ``x = sat(s - m)`` registered, the SFM's EXP2, ``p =
   round_shift(me << (sum_frac - mantissa_frac), ke)`` in two registered steps (the half added,
   then the shift), into a FIFO and ``z += p``; the VPU's AXPY
   accumulates ``N += p v`` exactly; RECIP of ``sat(z)`` and a four-stage output pipeline
   ``sat(round_shift(round_shift(N, kr - G) · r, out_shift))`` (the product as registered
   partial products, summed with the rounding half) into the state SRAM. Ranges: tail;
   band (hit) or body ``[F, L)`` (miss; the tail's keys a second time, with the body's maximum);
   the prefix again on a fallback; the sinks.
4. **Combine** (⊕ / ⊖ with the model's empty-state rules: an empty state passes the other one
   through by pointer, no transaction) through the :class:`~hdl.mac.merge.MergeUnit`'s streams,
   both operands read from the state SRAM's two read ports. Hit: entry (read from the entry
   store) ⊕ band; miss: body ⊖ tail, prefix on a flagged removal, empty when ``lo_tail = F``.
   The entry is written at the step's slot (a per-head counter of its steps mod window, as the
   MatchUnit's ring slot); output ``sinks ⊕ (E ⊕ tail)``. A head's positions arrive in order,
   from 0 or from any first position (a sequence whose prompt was processed elsewhere: its ring
   starts empty there); a match's position is the head's first position plus the MatchUnit's
   count of the matched step.

States (m, s scalars in registers, o vectors as ``d/L`` words in the state SRAM): tail, middle,
entry, E, E ⊕ tail, sinks, output. A state with ``s = 0`` is empty (its o is read as zeros: an
empty range costs no pass; a flagged removal is replaced by the fallback before it is used).
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.errors import ConfigError
from golden.mac_decode import STATE_READ_LATENCY, MacDecodeConfig
from golden.mac_unit import MergeOp
from golden.sfm import SfmOp
from golden.sram import SramConfig
from golden.vpu import VpuConfig, VpuOp

from ..lib.arith import incr, index_width, round_shift, saturate
from ..lib.pipe import csa_sum, delayed, delayed_write, placed, registered_product, scaled_round, selected_in_two
from ..lib.sfm import Sfm
from ..lib.slice import FifoSlice
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .match import MatchUnit
from .merge import MergeUnit



# physical state slots in the state SRAM (and the m / s register arrays)
TAIL, MID, ENT, E, O, SK, OUT = range(7)
N_SLOTS = 8

# result pointers of the combines: E, E ⊕ tail, output
P_E, P_O, P_OUT = 0, 1, 2


class Reader(enum.Enum, shape=2):
    """The state that reads the state SRAM's port 0, registered as it is entered and cleared as it
    ends (``_Program.reader``): the port's request and ``ready`` come from it, not from the state
    decode (the decode through the port's stall-all enable into the beat counters was 11.95 ns
    routed). MERGE also reads port 1."""
    NONE = 0
    MERGE = 1
    ENTRY_WRITE = 2
    EMIT = 3


def attend_vpu(cfg: MacDecodeConfig) -> VpuConfig:
    """The engine's VPU: DOT of q·k (kv_width) and AXPY of N += p v with the weight ``p`` (up to
    2^(sum_frac+1)) as the scalar, exact (axpy_shift 0, N below 2^(acc_width-1)); ``a`` is k or v
    (kv_width), so a product takes two MULT18X18D, not four; stall-free: KEYS and R_VALUES take
    every result as it comes and end only after the last, so the VPU needs no clock enable."""
    width = max(cfg.kv_width, cfg.sum_frac + 2)
    acc = max(2 * width + 2, cfg.max_positions.bit_length() + cfg.sum_frac + cfg.kv_width + 2)
    if width > 30 or acc > 62:
        raise ConfigError(f"mac-decode: sum_frac {cfg.sum_frac} / max_positions {cfg.max_positions} need a "
                          f"{width}-bit weight and {acc}-bit accumulator (VPU limits 30 / 62)")
    return VpuConfig(lanes=cfg.lanes, in_width=width, acc_width=acc, axpy_shift=0, a_width=cfg.kv_width,
                     stall_free=True)


def query_layout(cfg: MacDecodeConfig) -> data.StructLayout:
    return data.StructLayout({
        "head": unsigned(index_width(cfg.heads)), "position": unsigned(cfg.position_width),
        "reuse": unsigned(1),       # 0: the step misses (its layer is one of full_layers)
        "q_pre": data.ArrayLayout(signed(cfg.q_width), cfg.lanes),
        "q": data.ArrayLayout(signed(cfg.kv_width), cfg.lanes),
    })


def kv_request_layout(cfg: MacDecodeConfig) -> data.StructLayout:
    return data.StructLayout({"head": unsigned(index_width(cfg.heads)), "value": unsigned(1),
                              "first": unsigned(cfg.position_width), "count": unsigned(cfg.position_width)})


def kv_response_layout(cfg: MacDecodeConfig) -> data.ArrayLayout:
    return data.ArrayLayout(signed(cfg.kv_width), cfg.lanes)


def entry_request_layout(cfg: MacDecodeConfig) -> data.StructLayout:
    return data.StructLayout({
        "write": unsigned(1), "head": unsigned(index_width(cfg.heads)), "slot": unsigned(index_width(cfg.window)),
        "beat": unsigned(index_width(cfg.beats)),
        "m": signed(cfg.score_width), "s": unsigned(cfg.sum_width),
        "o": data.ArrayLayout(signed(cfg.out_width), cfg.lanes),
    })


def entry_response_layout(cfg: MacDecodeConfig) -> data.StructLayout:
    return data.StructLayout({
        "m": signed(cfg.score_width), "s": unsigned(cfg.sum_width),
        "o": data.ArrayLayout(signed(cfg.out_width), cfg.lanes),
    })


def out_layout(cfg: MacDecodeConfig) -> data.StructLayout:
    return data.StructLayout({
        "stats": unsigned(1),
        "m": signed(cfg.score_width), "s": unsigned(cfg.sum_width),
        "o": data.ArrayLayout(signed(cfg.out_width), cfg.lanes),
        "engaged": unsigned(1), "hit": unsigned(1), "fallback": unsigned(1),
        "position": unsigned(cfg.position_width), "distance": unsigned(cfg.vpu.acc_width),
        "keys": unsigned(cfg.position_width), "cycles": unsigned(32),
    })


class _Parts(NamedTuple):
    """The engine's submodules and the ports of its score and state SRAMs."""
    match: MatchUnit
    merge: MergeUnit
    vpu: Vpu
    sfm: Sfm
    scores: SramBank
    states: SramBank
    p_fifo: fifo.SyncFIFOBuffered
    score_req: object
    score_resp: object
    rd0_req: object
    rd0_resp: object
    rd1_req: object
    rd1_resp: object
    merge_in: FifoSlice


class _Step(NamedTuple):
    """The step's registers: query, match result, ranges, flags, cycles, state scalars, maxima, pointers."""
    query_buf: Array
    head: Signal
    position: Signal
    reuse: Signal             # the step's reuse bit, and its position at min_context - 1 or more
    write_slots: Array
    load_beat: Signal
    r_hit: Signal
    r_slot: Signal
    r_pos: Signal
    r_dist: Signal
    first_pos: Array
    started: Array
    L: Signal
    F: Signal
    lo_tail: Signal
    lo_band: Signal
    lo_mid: Signal
    keys: Signal
    engaged: Signal
    hit: Signal
    fallback: Signal
    cycles: Signal
    counting: Signal
    m_arr: Array
    s_arr: Array
    m_sink: Signal
    m_mid: Signal
    m_tail: Signal
    m_body: Signal
    ptrs: Array
    out_m: Signal
    out_s: Signal
    out_empty: Signal
    query_take: Signal
    slot_empty: Array
    slot_take: Signal
    slot_index: Signal
    slot_m: Signal
    slot_s: Signal

    def write_slot(self, m) -> None:
        """Write a state slot's (m, s) (which and what: ``MacDecodeEngine._writes``), landing a
        cycle later (see ``slot_take``)."""
        m.d.comb += self.slot_take.eq(1)


class _KeyPass(NamedTuple):
    """The K pass's request phase, response beat (the V pass's too), score positions and scores."""
    kq_phase: Signal
    resp_beat: Signal
    s_pos: Signal
    scored: Signal
    k_in: Signal
    k3_valid: Signal
    k3_score: Signal
    k4_valid: Signal
    k4_score: Signal
    k4_sink: Signal
    k4_mid: Signal
    k_query: Signal


class _Attend(NamedTuple):
    """A range attention's parameters, V pass counters, numerator, z, EXP2 and RECIP results."""
    r_lo: Signal
    r_hi: Signal
    r_m: Signal
    r_dst: Signal
    r_last: Signal
    sc_pos: Signal
    done_pos: Signal
    done_beat: Signal
    numer_first: Signal
    numer_out: object
    z_sum: Signal
    z_sat: Signal
    x_valid: Signal
    x_reg: Signal
    recip_m: Signal
    pre: Signal
    p_half_next: Signal
    p_half_valid: Signal
    p_half: Signal
    p_shift: Signal
    p_valid: Signal
    p_reg: Signal
    accumulate: object
    result_m: Signal
    result_s: Signal


class _RangeOut(NamedTuple):
    """The range output pipeline's issue counters and last stage."""
    o_issue: Signal
    o_beat: Signal
    o_issued: Signal
    o3_valid: Signal
    o3_beat: Signal
    o3_lane: list


class _Combine(NamedTuple):
    """A combine's operation, operands, destination, target pointer, result flag and beats."""
    c_op: Signal
    c_a: Signal
    c_b: Signal
    c_dst: Signal
    c_target: Signal
    c_flag: Signal
    mo_beat: Signal


class _Program(NamedTuple):
    """The step's program counter, the entry / output beat counters and the output's phase."""
    e_beat: Signal
    e_rbeat: Signal
    task: Signal
    stats_phase: Signal
    reader: Signal
    read_beat: Signal


def _position_shape(cfg: MacDecodeConfig):
    """Positions: W = max_positions.bit_length() + 1 bits hold 0..max_positions."""
    return unsigned(cfg.max_positions.bit_length() + 1)


class MacDecodeEngine(wiring.Component):
    """``query`` -> (``kv_req`` / ``kv_resp``, ``es_req`` / ``es_resp``) -> ``out``; one head's step at a time."""

    def __init__(self, cfg: MacDecodeConfig):
        self.cfg = cfg
        self.vpu_cfg = attend_vpu(cfg)
        super().__init__({
            "query": In(stream.Signature(query_layout(cfg))),
            "kv_req": Out(stream.Signature(kv_request_layout(cfg))),
            "kv_resp": In(stream.Signature(kv_response_layout(cfg))),
            "es_req": Out(stream.Signature(entry_request_layout(cfg))),
            "es_resp": In(stream.Signature(entry_response_layout(cfg))),
            "out": Out(stream.Signature(out_layout(cfg))),
        })

    def elaborate(self, platform):
        m = Module()
        nb = self.cfg.beats
        parts = self._parts(m)
        st = self._step_registers(m)
        kp = self._key_pipeline(m, parts.vpu, st)
        at = self._attend_registers(m, parts.sfm)
        ro = self._range_output_pipeline(m, at)
        cb, pg = self._combine_registers()

        m.d.comb += parts.match.result.ready.eq(1)
        self._writes(m, parts, st, at, ro, cb, pg)
        self._state_reads(m, parts, st, cb, pg)
        self._key_maxima(m, st, kp)
        with m.FSM():
            self._load_state(m, parts, st)
            self._match_states(m, parts, st, kp)
            self._key_pass_state(m, parts, st, kp, pg)
            self._dispatch_state(m, st, at, cb, pg)
            self._range_states(m, parts, st, kp, at, ro)
            self._combine_states(m, parts, st, cb, pg)
            self._entry_states(m, parts, st, pg)
            self._emit_state(m, parts, st, pg)
        return m

    def _writes(self, m, parts: _Parts, st: _Step, at: _Attend, ro: _RangeOut, cb: _Combine, pg: _Program):
        """The state SRAM's writes and which state slot a ``write_slot`` writes with what: MERGE's
        result beats and last beat's m and s (``c_dst``), R_OUT's output beats and range result
        (``r_dst``), ENTRY_READ's entry beats and m and s (ENT), else R_START's empty range
        (``r_dst``, zeros). They never meet in time (the output pipeline runs in R_OUT alone, the
        stall-free MergeUnit in MERGE, entry responses answer ENTRY_READ's requests), so address and
        data follow the valids, not the state decode (which into the write's data was 11.4 ns routed,
        into the slot values' registered copies 10.4 ns)."""
        nb, wr, merge = self.cfg.beats, parts.states.write, parts.merge
        entry = self.es_resp.valid & self.es_resp.ready   # (ready in ENTRY_READ alone)
        m.d.comb += wr.valid.eq(merge.o.valid | ro.o3_valid | entry)
        with m.If(merge.o.valid):
            m.d.comb += [wr.payload.addr.eq(cb.c_dst * nb + cb.mo_beat), wr.payload.data.eq(merge.o.payload.o),
                         st.slot_index.eq(cb.c_dst), st.slot_m.eq(merge.o.payload.m), st.slot_s.eq(merge.o.payload.s)]
        with m.Elif(ro.o3_valid):
            m.d.comb += [wr.payload.addr.eq(at.r_dst * nb + ro.o3_beat),
                         wr.payload.data.eq(Cat(*[o.as_unsigned() for o in ro.o3_lane])),
                         st.slot_index.eq(at.r_dst), st.slot_m.eq(at.result_m), st.slot_s.eq(at.result_s)]
        with m.Else():
            m.d.comb += [wr.payload.addr.eq(ENT * nb + pg.e_rbeat), wr.payload.data.eq(self.es_resp.payload.o)]
            with m.If(self.es_resp.valid):
                m.d.comb += [st.slot_index.eq(ENT), st.slot_m.eq(self.es_resp.payload.m),
                             st.slot_s.eq(self.es_resp.payload.s)]
            with m.Else():
                m.d.comb += st.slot_index.eq(at.r_dst)

    def _state_reads(self, m, parts: _Parts, st: _Step, cb: _Combine, pg: _Program):
        """The state SRAM's read requests and response ``ready`` for the state that reads it
        (``pg.reader``): MERGE both operands' beats (into the merge FIFO slice), ENTRY_WRITE E's
        (to the entry store), EMIT the output's (on ``out``, before the statistics beat)."""
        nb, q, beat = self.cfg.beats, parts.merge_in, pg.read_beat
        rd0_req, rd0_resp, rd1_req, rd1_resp = parts.rd0_req, parts.rd0_resp, parts.rd1_req, parts.rd1_resp
        # the requests' beat: 0 between readers (a reader is never set in the cycle its last ends)
        with m.If(pg.reader == Reader.NONE):
            m.d.sync += beat.eq(0)
        with m.Elif(rd0_req.valid & rd0_req.ready):
            m.d.sync += beat.eq(beat + 1)
        with m.Switch(pg.reader):
            with m.Case(Reader.MERGE):
                m.d.comb += [rd0_req.valid.eq(beat < nb), rd0_req.payload.addr.eq(cb.c_a * nb + beat),
                             rd1_req.valid.eq(beat < nb), rd1_req.payload.addr.eq(cb.c_b * nb + beat),
                             rd0_resp.ready.eq(q.i.ready), rd1_resp.ready.eq(q.i.ready)]
            with m.Case(Reader.ENTRY_WRITE):
                m.d.comb += [rd0_req.valid.eq(beat < nb), rd0_req.payload.addr.eq(st.ptrs[P_E] * nb + beat),
                             rd0_resp.ready.eq(self.es_req.ready)]
            with m.Case(Reader.EMIT):   # (no response is left for the statistics beat)
                m.d.comb += [rd0_req.valid.eq(beat < nb), rd0_req.payload.addr.eq(st.ptrs[P_OUT] * nb + beat),
                             rd0_resp.ready.eq(self.out.ready)]

    def _parts(self, m) -> _Parts:
        """The submodules: MatchUnit, MergeUnit, VPU, SFM, the score and state SRAMs, the p FIFO."""
        cfg = self.cfg
        nb, lanes, vcfg, sfm_cfg = cfg.beats, cfg.lanes, self.vpu_cfg, cfg.sfm
        sw, ow = cfg.score_width, cfg.out_width
        m.submodules.match = match = MatchUnit(cfg)
        m.submodules.merge = merge = MergeUnit(cfg, stall_free=True)   # (MERGE takes every beat, ends after the last)
        m.submodules.vpu = vpu = Vpu(vcfg)
        # the SFM's multiply with its DSP's registers: at 135 of 156 MULT18X18D the placer put it 83
        # columns from its operand register (14.9 ns routed, 10.5 of it routing, 67.1 MHz)
        m.submodules.sfm = sfm = Sfm(replace(sfm_cfg, dsp_registers=True))
        # the score SRAM's word registered after its bank select (read latency 3): the DP16KD's
        # output register, the select and x's subtract in one cycle were 10.0 ns routed
        m.submodules.scores = scores = SramBank(SramConfig(depth=cfg.max_positions, width=sw, read_latency=3))
        m.submodules.states = states = SramBank(SramConfig(depth=N_SLOTS * nb, width=lanes * ow, read_ports=2,
                                                           read_latency=STATE_READ_LATENCY,
                                                           address_register=True))
        m.submodules.p_fifo = p_fifo = fifo.SyncFIFOBuffered(width=vcfg.in_width, depth=4)
        score_req, score_resp = scores.read_port(0)
        rd0_req, rd0_resp = states.read_port(0)
        rd1_req, rd1_resp = states.read_port(1)
        # both operands' beats, queued between the state SRAM's read ports and the MergeUnit: the
        # MergeUnit's ``ready`` (from its beat counter) would otherwise reach the read pipelines'
        # clock enables across the die (the 73.6 MHz path, docs/synthesis.md)
        m.submodules.merge_in = merge_in = FifoSlice(2 * lanes * ow)
        return _Parts(match, merge, vpu, sfm, scores, states, p_fifo, score_req, score_resp,
                      rd0_req, rd0_resp, rd1_req, rd1_resp, merge_in)

    def _step_registers(self, m) -> _Step:
        """The step's registers, and its cycle counter (the step's cycles, less those with out stalled)."""
        cfg = self.cfg
        nb, lanes, sw = cfg.beats, cfg.lanes, cfg.score_width
        pos_t = _position_shape(cfg)
        query_buf = Array(Signal(lanes * cfg.kv_width, name=f"q_beat{b}") for b in range(nb))
        head = Signal(index_width(cfg.heads))
        position = Signal(pos_t)
        reuse = Signal()
        write_slots = Array(Signal(range(cfg.window), name=f"entry_slot{h}") for h in range(cfg.heads))
        load_beat = Signal(range(nb))
        # match result
        r_hit, r_slot = Signal(), Signal(index_width(cfg.window))
        r_pos, r_dist = Signal(cfg.position_width), Signal(cfg.vpu.acc_width)
        # each head's first position (the MatchUnit counts a head's steps from 0: a match's position
        # is the head's first plus the matched step's count)
        first_pos = Array(Signal(cfg.position_width, name=f"first_position{h}") for h in range(cfg.heads))
        started = Array(Signal(name=f"started{h}") for h in range(cfg.heads))
        # step ranges
        L, F, lo_tail, lo_band, lo_mid, keys = (Signal(pos_t, name=n) for n in
                                                ("L", "F", "lo_tail", "lo_band", "lo_mid", "keys"))
        engaged, hit, fallback = Signal(), Signal(), Signal()
        # cycles: the step's, less those with out stalled (the statistic stays put while its beat
        # waits, as the stream's payload must; the LAD tile counts the same way)
        cycles = Signal(32)
        counting = Signal()
        with m.If(counting & ~(self.out.valid & ~self.out.ready)):
            m.d.sync += cycles.eq(cycles + 1)

        # per-state scalars
        m_arr = Array(Signal(signed(sw), name=f"state_m{i}") for i in range(N_SLOTS))
        s_arr = Array(Signal(cfg.sum_width, name=f"state_s{i}") for i in range(N_SLOTS))
        # maxima of the K pass, and the body's (middle and tail), registered every cycle: DISPATCH
        # reads it two states after KEYS (the compare and select in series with the range's
        # registers were 10.1 ns routed)
        m_sink, m_mid, m_tail = (Signal(signed(sw), name=n) for n in ("m_sink", "m_mid", "m_tail"))
        m_body = delayed(m, Mux(m_mid > m_tail, m_mid, m_tail), "m_body")
        # result pointers of the combines: E, E ⊕ tail, output
        ptrs = Array(Signal(3, name=f"ptr{i}") for i in range(3))
        # the output state's m, s and emptiness, selected every cycle by a registered copy of its
        # pointer (m and s in two registered steps, ``selected_in_two``): EMIT reads them from its
        # first output beat on, a state SRAM read (four cycles) after it starts and a DISPATCH cycle
        # or more after the program's last write. The pointer's selects and s's zero test in series
        # with out's payload were the routed worst path (13.9 ns, 71.9 MHz); the select from the
        # pointer itself, which drives much else, 10.1 ns routed; by the copy in one step, 10.2 ns
        out_empty = Signal()
        out_ptr = delayed(m, ptrs[P_OUT], "out_ptr")
        out_m, out_s = selected_in_two(m, list(m_arr), out_ptr, "out_m"), selected_in_two(m, list(s_arr), out_ptr, "out_s")
        # a state slot's (m, s) and emptiness (s = 0) land a cycle after the state that writes them
        # (``_Step.write_slot``, ``_writes``), from registered copies: each slot's enable then comes from two
        # registers, not from the state decode and a range's compare (10.2-11.0 ns routed into the
        # enables of the slots' 600 flip-flops), and the emptiness is tested on a register (the
        # slot's select and the 40-bit zero test in series with the next state were 12.0 ns
        # routed). Their readers come after a DISPATCH cycle: COMBINE and ENTRY_WRITE read the slots,
        # and EMIT's first beat (a state SRAM read after EMIT starts) reads out_m, out_s, out_empty
        slot_take, slot_index = Signal(), Signal(range(N_SLOTS))
        slot_m, slot_s = Signal.like(m_arr[0], name="slot_m"), Signal.like(s_arr[0], name="slot_s")
        slot_empty = Array(Signal(init=1, name=f"state_empty{i}") for i in range(N_SLOTS))
        take_d, index_d = delayed(m, slot_take, "slot_take_d"), delayed(m, slot_index, "slot_index_d")
        m_d, s_d = delayed(m, slot_m, "slot_m_d"), delayed(m, slot_s, "slot_s_d")
        # (s's zero test before the copy: after it, into the eight emptiness registers, 10.4 ns routed)
        empty_d = delayed(m, slot_s == 0, "slot_empty_d")
        with m.If(take_d):
            m.d.sync += [m_arr[index_d].eq(m_d), s_arr[index_d].eq(s_d), slot_empty[index_d].eq(empty_d)]
        m.d.sync += out_empty.eq(slot_empty[out_ptr])   # (s's 40-bit zero test behind an 8:1 select: 10.7 ns routed)
        # the query's beats land in query_buf a cycle after LOAD takes them (query_take): the
        # handshake (the state's decode, the MatchUnit's ready) then reaches a few registers instead
        # of the buffer's 1,024 flip-flops (11.4 ns routed into them); KEYS reads the buffer four
        # states later
        query_take = Signal()
        delayed_write(m, query_buf, query_take, load_beat, self.query.payload.q, "query_write")
        return _Step(query_buf, head, position, reuse, write_slots, load_beat, r_hit, r_slot, r_pos, r_dist,
                     first_pos, started, L, F, lo_tail, lo_band, lo_mid, keys, engaged, hit, fallback, cycles, counting,
                     m_arr, s_arr, m_sink, m_mid, m_tail, m_body, ptrs, out_m, out_s, out_empty, query_take, slot_empty,
                     slot_take, slot_index, slot_m, slot_s)

    def _key_pipeline(self, m, vpu, st: _Step) -> _KeyPass:
        """The K pass's counters and its score pipeline: three stages from q·k to the score, and
        the score once more with its key's region (sinks, middle) for the maxima."""
        cfg = self.cfg
        nb = cfg.beats
        pos_t = _position_shape(cfg)
        # -- K pass: request phase, response beat, score positions
        kq_phase = Signal(2)
        resp_beat = Signal(range(nb))
        s_pos, scored = Signal(pos_t), Signal(pos_t)
        k_in = Signal()
        k1_valid, k2_valid, k3_valid = Signal(), Signal(), Signal()
        k3_score = scaled_round(m, vpu.o.payload.dot, cfg.scale_raw, cfg.score_shift, signed(cfg.score_width),
                                "k3_score")
        m.d.sync += [k1_valid.eq(k_in), k2_valid.eq(k1_valid), k3_valid.eq(k2_valid)]
        # k4: a maximum's enable is then a region bit, one compare and a valid (the position's
        # compares and the score's in series were 10.7 ns routed into the maxima's enables)
        k4_valid, k4_score = delayed(m, k3_valid, "k4_valid"), delayed(m, k3_score, "k4_score")
        k4_sink, k4_mid = delayed(m, s_pos < st.F, "k4_sink"), delayed(m, s_pos < st.lo_tail, "k4_mid")
        # the query beat of the key beat at the VPU's input, from a register (its 16:1 select of the
        # query buffer by resp_beat, in series with the VPU's input, was 10.6 ns routed)
        k_query = Signal(cfg.lanes * cfg.kv_width)
        return _KeyPass(kq_phase, resp_beat, s_pos, scored, k_in, k3_valid, k3_score, k4_valid, k4_score, k4_sink,
                        k4_mid, k_query)

    def _attend_registers(self, m, sfm) -> _Attend:
        """A range attention's registers, with z saturated and the weight p of an EXP2 result."""
        cfg = self.cfg
        nb, lanes, vcfg, sfm_cfg = cfg.beats, cfg.lanes, self.vpu_cfg, cfg.sfm
        sw, aw = cfg.score_width, vcfg.acc_width
        pos_t = _position_shape(cfg)
        # -- range attention: parameters, V pass counters, numerator, output pipeline
        r_lo, r_hi, r_m, r_dst = Signal(pos_t), Signal(pos_t), Signal(signed(sw)), Signal(3)
        r_last = Signal(pos_t)   # hi - lo - 1, the last key's index in the pass, registered in R_START
        sc_pos, done_pos = Signal(pos_t), Signal(pos_t)
        done_beat = Signal(range(nb))
        # N: d/L words of the lanes' accumulators in LUT RAM (one write port; the accumulation's
        # and the output's read ports); numer_first, set in R_START, makes the first key's products
        # overwrite the words instead of adding to them (nothing zeroes N)
        m.submodules.numer = numer = memory.Memory(shape=unsigned(lanes * aw), depth=nb, init=[])
        numer_first, numer_out = Signal(), numer.read_port(domain="comb")   # (the output's read port)
        z_sum = Signal(cfg.sum_width + 2)
        z_sat = Signal(cfg.sum_width)
        m.d.comb += z_sat.eq(saturate(z_sum, unsigned(cfg.sum_width)))
        x_valid, x_reg = Signal(), Signal(signed(sw))
        recip_m = Signal(sfm_cfg.value_width)
        pre = Signal(range(64))
        # p = round_shift(me << (sum_frac - mantissa_frac), ke) of an EXP2 result, in two registered
        # steps: the rounding half added (p_half, with ke in p_shift), then the shift by ke (p_reg,
        # with its valid, before the p FIFO and z's add). The half's decode, its carry chain and the
        # barrel shift in one cycle were the engine's worst path before placement (13.6 ns,
        # benchmarks/netlist_paths.py); with z's add as well, 34 levels (56.7 MHz routed)
        me, ke = sfm.o.payload.value, sfm.o.payload.exponent
        half_added = (me << (cfg.sum_frac - cfg.mantissa_frac)) + ((Const(1, 1) << ke) >> 1)
        p_half_next = Signal(half_added.shape())
        m.d.comb += p_half_next.eq(half_added)
        p_half_valid, p_half, p_shift = Signal(), Signal(half_added.shape()), Signal.like(ke)
        p_valid, p_reg = Signal(), Signal(vcfg.in_width)
        # the range's state scalars (m, or 0 when z = 0; z saturated), registered every cycle: R_OUT
        # writes them at its last beat, long after z's last add. z's zero test and saturation in
        # series with the state slot's write were 11.2-11.5 ns routed (79.3 MHz); the zero test
        # into result_m, which Yosys shared with the SFM's leading one of z, 10.3 ns routed: it has
        # its own register
        result_m = delayed(m, Mux(delayed(m, z_sum == 0, "range_z_zero"), 0, r_m), "range_result_m")
        result_s = delayed(m, z_sat, "range_result_s")
        return _Attend(r_lo, r_hi, r_m, r_dst, r_last, sc_pos, done_pos, done_beat, numer_first, numer_out, z_sum,
                       z_sat, x_valid, x_reg, recip_m, pre, p_half_next, p_half_valid, p_half, p_shift, p_valid, p_reg,
                       self._numer_accumulate(m, numer, done_beat, numer_first), result_m, result_s)

    def _numer_accumulate(self, m, numer, beat, first):
        """``accumulate(vec)``: the statements that add the VPU's lanes ``vec`` into N's word
        ``beat`` (into zeros while ``first``), a read-modify-write in two registered steps: the word
        read, its beat and ``vec`` registered, then the lanes' adds written back (the word's select
        and the adds in one cycle were the engine's critical path, 68.7 MHz, with N in flip-flops).
        A beat is read again ``d/L`` cycles later: with two beats or more its write has landed; with
        one (``d = L``) the sum being written is forwarded."""
        nb, lanes, aw = self.cfg.beats, self.cfg.lanes, self.vpu_cfg.acc_width
        wr, rd = numer.write_port(), numer.read_port(domain="comb")
        valid, beat_reg = Signal(), Signal(range(nb))
        word, vec_reg = Signal(lanes * aw, name="numer_word"), Signal(lanes * aw, name="numer_vec")
        m.d.sync += valid.eq(0)             # (the state's update below sets it, later in the statements' order)
        m.d.comb += [rd.addr.eq(beat), wr.en.eq(valid), wr.addr.eq(beat_reg),
                     wr.data.eq(Cat(*[(word[l * aw:(l + 1) * aw].as_signed() + vec_reg[l * aw:(l + 1) * aw].as_signed())
                                      [:aw] for l in range(lanes)]))]
        word_read = Mux(first, 0, Mux(valid, wr.data, rd.data) if nb == 1 else rd.data)
        return lambda vec: [valid.eq(1), beat_reg.eq(beat), word.eq(word_read), vec_reg.eq(vec.as_value())]

    def _range_output_pipeline(self, m, at: _Attend) -> _RangeOut:
        """The range output pipeline: sat(round_shift(round_shift(N, kr - G) · r, out_shift)) per beat."""
        cfg = self.cfg
        nb, lanes, sfm_cfg = cfg.beats, cfg.lanes, cfg.sfm
        ow, aw = cfg.out_width, self.vpu_cfg.acc_width
        numer_out, recip_m, pre = at.numer_out, at.recip_m, at.pre
        # output pipeline: N's beat (the word select registered); plus the rounding half of kr - G
        # (registered: the select, the 57-bit add and the barrel shift in one cycle were the
        # engine's critical path, 19.4 ns, 51.5 MHz); shifted by kr - G; partial products of that
        # times r (one MULT18X18D each, registered); their sum with the rounding half; shift and
        # saturate. (pre is set in R_RECIP_WAIT, a cycle before the first beat issues, so its
        # half, a register of its own, is ready when the first beat's word is.) The product's
        # operands are copied into registers loaded every cycle and its pieces registered twice,
        # so synth/absorb.py moves a register of each into the MULT18X18D and only routing lies
        # between the DSP's pins and the fabric (the DSP placed 77 columns from its operand and
        # product registers was the engine's worst routed path, 13.45 ns, 74.4 MHz)
        o_issue, o_beat, o_issued = Signal(), Signal(range(nb)), Signal()
        stages = 8
        valid = [Signal(name=f"ro_valid{i}") for i in range(stages)]
        beat = [Signal(range(nb), name=f"ro_beat{i}") for i in range(stages)]
        m.d.sync += [valid[0].eq(o_issue), beat[0].eq(o_beat),
                     *(x[i + 1].eq(x[i]) for x in (valid, beat) for i in range(stages - 1))]
        word = Signal.like(numer_out.data, name="ro_word")
        pre_half = Signal(64, name="ro_pre_half")
        m.d.comb += numer_out.addr.eq(o_beat)
        m.d.sync += [word.eq(numer_out.data), pre_half.eq((Const(1, 1) << pre) >> 1)]
        sums = [Signal(signed(max(aw, 64) + 2), name=f"ro_sum{l}") for l in range(lanes)]
        o0_lane = [Signal(signed(aw + 1), name=f"ro0_lane{l}") for l in range(lanes)]
        pw = aw + 1 + sfm_cfg.value_width + 1
        o2_t = [Signal(signed(pw + 1), name=f"ro2_t{l}") for l in range(lanes)]
        o3_lane = [Signal(signed(ow), name=f"ro3_lane{l}") for l in range(lanes)]
        out_half = 1 << (cfg.out_shift - 1)      # out_shift >= guard + mantissa_frac > 0
        o3_valid, o3_beat = valid[-1], beat[-1]
        recip_copy = delayed(m, recip_m, "ro_recip")
        for l in range(lanes):
            n_l = word[l * aw:(l + 1) * aw].as_signed()
            o1_pp = registered_product(m, delayed(m, o0_lane[l], f"ro0d_lane{l}"), recip_copy, f"ro1_{l}")
            m.d.sync += [sums[l].eq(n_l + pre_half), o0_lane[l].eq(sums[l] >> pre),
                         o2_t[l].eq(csa_sum(m, placed(o1_pp) + [Const(out_half, pw + 1)],
                                            pw + 1, f"ro2_{l}").as_signed()),
                         o3_lane[l].eq(saturate(o2_t[l] >> cfg.out_shift, signed(ow)))]
        return _RangeOut(o_issue, o_beat, o_issued, o3_valid, o3_beat, o3_lane)

    def _combine_registers(self) -> tuple[_Combine, _Program]:
        """The combine's registers; the step's program counter and entry / output beat counters."""
        nb = self.cfg.beats
        # -- combine: operands, destination, target pointer, result flag
        c_op, c_a, c_b, c_dst, c_target = Signal(), Signal(3), Signal(3), Signal(3), Signal(2)
        c_flag = Signal()
        mo_beat = Signal(range(nb))
        # entry / output beats
        e_beat, e_rbeat = Signal(range(nb + 1)), Signal(range(nb))

        task = Signal(4)
        stats_phase = Signal()
        return (_Combine(c_op, c_a, c_b, c_dst, c_target, c_flag, mo_beat),
                _Program(e_beat, e_rbeat, task, stats_phase, Signal(Reader), Signal(range(nb + 1), name="read_beat")))

    def _load_state(self, m, parts: _Parts, st: _Step):
        """LOAD: the pre-RoPE query beats into the MatchUnit, the post-RoPE ones into the query buffer."""
        cfg = self.cfg
        nb, match = cfg.beats, parts.match
        counting, cycles, load_beat = st.counting, st.cycles, st.load_beat
        with m.State("LOAD"):
            # the pre-RoPE beats straight into the MatchUnit; the post-RoPE ones buffered
            p = self.query.payload
            m.d.comb += [match.query.valid.eq(self.query.valid), self.query.ready.eq(match.query.ready),
                         match.query.payload.head.eq(p.head), match.query.payload.q.eq(p.q_pre)]
            with m.If(self.query.valid & ~counting):   # a step's cycles count from its first beat offered
                m.d.sync += [counting.eq(1), cycles.eq(1)]
            m.d.comb += st.query_take.eq(self.query.valid & self.query.ready)
            with m.If(self.query.valid & self.query.ready):
                m.d.sync += load_beat.eq(incr(load_beat, nb))
                with m.If(load_beat == 0):
                    # the step asks for reuse at a context of min_context or more (decided here, from the
                    # beat: in MATCH the compare decided the next state, 11.4 ns routed)
                    at_context = p.position >= cfg.min_context - 1 if cfg.min_context > 0 else Const(1, 1)
                    m.d.sync += [st.head.eq(p.head), st.position.eq(p.position), st.reuse.eq(p.reuse & at_context)]
                with m.If(load_beat == nb - 1):
                    m.next = "MATCH"

    def _match_states(self, m, parts: _Parts, st: _Step, kp: _KeyPass):
        """MATCH, RANGES, RANGES2, RANGES3: the match result, then F, lo_tail, lo_band, lo_mid and the keys read."""
        cfg = self.cfg
        # positions in W bits, differences in signed W + 2. The band as a constant at most
        # max_positions (>= L, >= r_pos + 1: a longer band clamps the same way, and L - band stays
        # in dif_t whatever cfg.band is)
        W = len(st.position)
        dif_t = signed(W + 2)
        band = min(cfg.band, cfg.max_positions)
        sf, match = cfg.score_format, parts.match
        position, L, F, engaged, hit = st.position, st.L, st.F, st.engaged, st.hit
        lo_tail, r_pos = st.lo_tail, st.r_pos
        # the bounds' adds one state before their compares, each a register: L - band (tail_lo) and
        # the head's first position + 1 - band (band_base) in MATCH, the match's position + 1 - band
        # (band_lo) in RANGES. An add, the compares with F and lo_tail and their muxes in one state
        # were the engine's routed worst paths (12.1-12.6 ns, 79.3 MHz). (position + 1 - band, not
        # L - band, in MATCH: L is written there too)
        tail_lo, band_base, band_lo = Signal(dif_t), Signal(dif_t), Signal(dif_t)
        with m.State("MATCH"):
            # below min_context (or without reuse, the config's or the step's) the step does not
            # wait for the match: the MatchUnit scans and writes its ring meanwhile, and its result
            # is dropped (``ready`` is high in every state; the next query is taken only after it)
            # (st.reuse: the step's reuse bit and its context of min_context or more, from LOAD)
            engage = int(cfg.reuse) & st.reuse
            first = Mux(st.started[st.head], st.first_pos[st.head], position)   # the head's first position
            m.d.sync += [L.eq(position + 1), F.eq(Mux(position + 1 > cfg.sinks, cfg.sinks, position + 1)),
                         engaged.eq(engage), tail_lo.eq(position + 1 - band), band_base.eq(first + 1 - band)]
            with m.If(~st.started[st.head]):
                m.d.sync += [st.started[st.head].eq(1), st.first_pos[st.head].eq(position)]
            with m.If(~engage):
                m.next = "RANGES"
            with m.Elif(match.result.valid):
                rp = match.result.payload
                m.d.sync += [st.r_hit.eq(rp.hit), st.r_slot.eq(rp.slot), r_pos.eq(rp.position),
                             st.r_dist.eq(rp.distance)]
                m.next = "RANGES"
        with m.State("RANGES"):
            lt = Mux(tail_lo > F, tail_lo, F)
            m.d.sync += [lo_tail.eq(lt), hit.eq(engaged & st.r_hit), st.fallback.eq(0),
                         r_pos.eq(r_pos + st.first_pos[st.head]),   # the match's step count -> its position
                         band_lo.eq(r_pos + band_base)]
            m.next = "RANGES2"
        with m.State("RANGES2"):
            lb = Mux(band_lo < F, F, Mux(band_lo > lo_tail, lo_tail, band_lo))
            m.d.sync += [st.lo_band.eq(lb), st.lo_mid.eq(Mux(hit, lb, F))]
            m.next = "RANGES3"
        with m.State("RANGES3"):   # (the band's bounds, then the key count from them: in one state
            mid = st.lo_mid        # their carry chains in series were the engine's critical path, 66.3 MHz)
            m.d.sync += [st.keys.eq(F + L - mid),
                         kp.kq_phase.eq(0), kp.resp_beat.eq(0), kp.k_query.eq(st.query_buf[0]), kp.scored.eq(0),
                         kp.s_pos.eq(Mux(F != 0, 0, mid)),
                         st.m_sink.eq(sf.min_raw), st.m_mid.eq(sf.min_raw), st.m_tail.eq(sf.min_raw)]
            m.next = "KEYS"

    def _key_maxima(self, m, st: _Step, kp: _KeyPass):
        """The K pass's maxima (sinks, middle, tail) from each score a cycle after it (k4, its key's
        region registered beside it), in two steps: the compare into a register (k5), then the
        maximum's enable straight from it (the compare into the 24 enables was 10.3 ns routed).
        Scores come d/L cycles apart; with d = L (one beat) they come a cycle apart, and a compare
        takes the maximum that the score at k5 leaves (that forward, in the loop through ``raises``,
        was 10.5 ns routed, so only d = L builds it). The last key's maxima land with DISPATCH's
        second cycle, whose task (the tail's range) is the first to read one; RANGES3 resets them
        (the FSM's assignments come later)."""
        k4_valid, k4_score, k4_sink, k4_mid = kp.k4_valid, kp.k4_score, kp.k4_sink, kp.k4_mid
        k5_score = delayed(m, k4_score, "k5_score")
        for mx, region, name in ((st.m_sink, k4_sink, "sink"), (st.m_mid, ~k4_sink & k4_mid, "mid"),
                                 (st.m_tail, ~k4_sink & ~k4_mid, "tail")):
            raises = Signal(name=f"k5_raises_{name}")
            ahead = Mux(raises, k5_score, mx) if self.cfg.beats == 1 else mx
            m.d.sync += raises.eq(k4_valid & region & (k4_score > ahead))
            with m.If(raises):
                m.d.sync += mx.eq(k5_score)

    def _key_pass_state(self, m, parts: _Parts, st: _Step, kp: _KeyPass, pg: _Program):
        """KEYS: the K bursts, DOT of each key with the query, the scores into the score SRAM (their
        maxima: ``_key_maxima``)."""
        cfg = self.cfg
        nb, lanes = cfg.beats, cfg.lanes
        vpu, scores = parts.vpu, parts.scores
        head, L, F, lo_mid, lo_tail, query_buf = st.head, st.L, st.F, st.lo_mid, st.lo_tail, st.query_buf
        kq_phase, resp_beat, s_pos, scored, k3_valid, k3_score = (kp.kq_phase, kp.resp_beat, kp.s_pos, kp.scored,
                                                                   kp.k3_valid, kp.k3_score)
        with m.State("KEYS"):
            # requests: the sinks [0, F), then [lo_mid, L)
            has0, has1 = F != 0, L != lo_mid
            m.d.comb += [self.kv_req.payload.head.eq(head), self.kv_req.payload.value.eq(0),
                         self.kv_req.payload.first.eq(Mux(kq_phase == 0, 0, lo_mid)),
                         self.kv_req.payload.count.eq(Mux(kq_phase == 0, F, L - lo_mid)),
                         self.kv_req.valid.eq(((kq_phase == 0) & has0) | ((kq_phase == 1) & has1))]
            with m.If(kq_phase == 0):
                with m.If(~has0 | self.kv_req.ready):
                    m.d.sync += kq_phase.eq(1)
            with m.Elif(kq_phase == 1):
                with m.If(~has1 | self.kv_req.ready):
                    m.d.sync += kq_phase.eq(2)
            # key beats -> DOT with the buffered query beat
            m.d.comb += [vpu.i.valid.eq(self.kv_resp.valid), self.kv_resp.ready.eq(vpu.i.ready),
                         vpu.i.payload.op.eq(VpuOp.DOT), vpu.i.payload.last.eq(resp_beat == nb - 1)]
            for l in range(lanes):
                m.d.comb += [vpu.i.payload.a[l].eq(self.kv_resp.payload[l]),
                             vpu.i.payload.b[l].eq(kp.k_query[l * cfg.kv_width:(l + 1) * cfg.kv_width].as_signed())]
            with m.If(vpu.i.valid & vpu.i.ready):
                next_beat = incr(resp_beat, nb)
                m.d.sync += [resp_beat.eq(next_beat), kp.k_query.eq(query_buf[next_beat])]
            m.d.comb += kp.k_in.eq(vpu.o.valid)
            with m.If(k3_valid):
                m.d.comb += [scores.write.valid.eq(1), scores.write.payload.addr.eq(s_pos),
                             scores.write.payload.data.eq(k3_score)]
                m.d.sync += [scored.eq(scored + 1), s_pos.eq(Mux(s_pos + 1 == F, lo_mid, s_pos + 1))]
            with m.If(~k3_valid & (scored == st.keys) & (kq_phase == 2)):
                m.d.sync += pg.task.eq(0)
                m.next = "DISPATCH"

    def _dispatch_state(self, m, st: _Step, at: _Attend, cb: _Combine, pg: _Program):
        """DISPATCH: the step's program, one range, combine, entry read / write or output at a time."""
        hit, lo_tail, F, L, ptrs, task = st.hit, st.lo_tail, st.F, st.L, st.ptrs, pg.task
        m_sink, m_mid, m_tail = st.m_sink, st.m_mid, st.m_tail

        def start_range(lo, hi, mref, dst):
            m.d.sync += [at.r_lo.eq(lo), at.r_hi.eq(hi), at.r_m.eq(mref), at.r_dst.eq(dst)]
            m.next = "R_START"

        def start_combine(op, a, b, dst, target):
            m.d.sync += [cb.c_op.eq(op), cb.c_a.eq(a), cb.c_b.eq(b), cb.c_dst.eq(dst), cb.c_target.eq(target)]
            m.next = "COMBINE"

        # a miss reads a body (its bounds fixed since RANGES2), registered: the compare in series with
        # the task's decode into the next state was 11.3 ns routed
        miss_body = delayed(m, ~hit & (lo_tail != F), "miss_body")
        with m.State("DISPATCH"):
            m.d.sync += task.eq(task + 1)
            with m.Switch(task):
                with m.Case(0):                   # the matched entry (hit)
                    with m.If(hit):
                        m.d.sync += [pg.e_beat.eq(0), pg.e_rbeat.eq(0)]
                        m.next = "ENTRY_READ"
                with m.Case(1):                   # tail
                    start_range(lo_tail, L, m_tail, TAIL)
                with m.Case(2):                   # band (hit), body (miss) or empty
                    with m.If(hit):
                        start_range(st.lo_band, lo_tail, m_mid, MID)
                    with m.Elif(miss_body):
                        start_range(F, L, st.m_body, MID)
                    with m.Else():
                        start_range(F, F, 0, MID)
                with m.Case(3):                   # E = entry ⊕ band | body ⊖ tail | empty
                    with m.If(hit):
                        start_combine(MergeOp.MERGE, ENT, MID, E, P_E)
                    with m.Elif(miss_body):
                        start_combine(MergeOp.DOWNDATE, MID, TAIL, E, P_E)
                    with m.Else():
                        m.d.sync += ptrs[P_E].eq(MID)
                with m.Case(4):                   # fallback: the prefix again
                    with m.If(miss_body & cb.c_flag):
                        m.d.sync += [st.fallback.eq(1), ptrs[P_E].eq(MID)]
                        start_range(F, lo_tail, m_mid, MID)
                with m.Case(5):                   # write E
                    m.d.sync += pg.reader.eq(Reader.ENTRY_WRITE)
                    m.next = "ENTRY_WRITE"
                with m.Case(6):
                    start_combine(MergeOp.MERGE, ptrs[P_E], TAIL, O, P_O)
                with m.Case(7):                   # sinks
                    start_range(0, F, m_sink, SK)
                with m.Case(8):
                    start_combine(MergeOp.MERGE, SK, ptrs[P_O], OUT, P_OUT)
                with m.Case(9):
                    m.d.sync += [pg.e_rbeat.eq(0), pg.stats_phase.eq(0), pg.reader.eq(Reader.EMIT)]
                    m.next = "EMIT"

    def _range_states(self, m, parts: _Parts, st: _Step, kp: _KeyPass, at: _Attend, ro: _RangeOut):
        """R_START .. R_OUT: a range's V burst, EXP2 weights, z and N, RECIP of z and N's output beats."""
        cfg = self.cfg
        nb, lanes, sw, aw = cfg.beats, cfg.lanes, cfg.score_width, self.vpu_cfg.acc_width
        vpu, sfm, p_fifo, score_req, score_resp = parts.vpu, parts.sfm, parts.p_fifo, parts.score_req, parts.score_resp
        m_arr, s_arr, resp_beat = st.m_arr, st.s_arr, kp.resp_beat
        r_lo, r_hi, r_m, r_dst, sc_pos, done_pos, done_beat = (at.r_lo, at.r_hi, at.r_m, at.r_dst, at.sc_pos,
                                                               at.done_pos, at.done_beat)
        z_sum, z_sat, x_valid, x_reg, p_valid, p_reg = at.z_sum, at.z_sat, at.x_valid, at.x_reg, at.p_valid, at.p_reg
        o_beat, o_issued = ro.o_beat, ro.o_issued
        # the SFM's operands in every state (it reads them only with valid): x and z leave registers
        # and its op a register set for R_RECIP, not the state decode's mux (10.3 ns routed into
        # its first stage's compares)
        sfm_recip = Signal()
        m.d.comb += [sfm.i.payload.op.eq(Mux(sfm_recip, SfmOp.RECIP, SfmOp.EXP2)), sfm.i.payload.x.eq(x_reg),
                     sfm.i.payload.z.eq(z_sat)]
        with m.State("R_START"):
            m.d.sync += [sc_pos.eq(r_lo), done_pos.eq(0), done_beat.eq(0), resp_beat.eq(0), z_sum.eq(0),
                         at.r_last.eq(r_hi - r_lo - 1), at.numer_first.eq(1), sfm_recip.eq(0)]
            m.d.comb += [self.kv_req.payload.head.eq(st.head), self.kv_req.payload.value.eq(1),
                         self.kv_req.payload.first.eq(r_lo), self.kv_req.payload.count.eq(r_hi - r_lo)]
            with m.If(r_hi == r_lo):              # the empty state; its o is read as zeros (s = 0)
                st.write_slot(m)   # r_dst := (0, 0)
                m.next = "DISPATCH"
            with m.Else():
                m.d.comb += self.kv_req.valid.eq(1)
                with m.If(self.kv_req.ready):
                    m.next = "R_VALUES"
        # the score and SFM responses' ready in every state, not through the state decode (into the
        # score SRAM's and SFM's enables: 10.5-11.6 ns routed): both answer R_VALUES alone (and the
        # SFM R_RECIP), and both valids are clear when the pass ends, so ~p_half_valid holds after it
        p_takes = ~at.p_valid | p_fifo.w_rdy
        m.d.comb += [score_resp.ready.eq(~x_valid | sfm.i.ready), sfm.o.ready.eq(~at.p_half_valid | p_takes)]
        with m.State("R_VALUES"):
            m.d.comb += [score_req.valid.eq(sc_pos < r_hi), score_req.payload.addr.eq(sc_pos)]
            with m.If(score_req.valid & score_req.ready):
                m.d.sync += sc_pos.eq(sc_pos + 1)
            with m.If(score_resp.ready):
                m.d.sync += [x_valid.eq(score_resp.valid),
                             x_reg.eq(saturate(score_resp.payload.as_signed() - r_m, signed(sw)))]
            m.d.comb += [sfm.i.valid.eq(x_valid),
                         p_fifo.w_data.eq(p_reg), p_fifo.w_en.eq(p_valid)]
            # (both valids are clear when the pass ends: the V beats take every p)
            with m.If(sfm.o.ready):
                m.d.sync += [at.p_half_valid.eq(sfm.o.valid), at.p_half.eq(at.p_half_next),
                             at.p_shift.eq(sfm.o.payload.exponent)]
            with m.If(p_takes):
                m.d.sync += [p_valid.eq(at.p_half_valid), p_reg.eq(at.p_half >> at.p_shift)]
            with m.If(p_valid & p_fifo.w_rdy):
                m.d.sync += z_sum.eq(z_sum + p_reg)
            # AXPY with acc = 0 gives the exact products p v; they are added into N's beat
            # where they come out of the VPU, so a beat is never read before its update lands
            # (one beat per cycle whatever the VPU's latency and d/L)
            m.d.comb += [vpu.i.valid.eq(self.kv_resp.valid & p_fifo.r_rdy),
                         self.kv_resp.ready.eq(vpu.i.ready & p_fifo.r_rdy),
                         p_fifo.r_en.eq(vpu.i.ready & self.kv_resp.valid & (resp_beat == nb - 1)),
                         vpu.i.payload.op.eq(VpuOp.AXPY), vpu.i.payload.last.eq(1),
                         vpu.i.payload.scalar.eq(p_fifo.r_data)]
            for l in range(lanes):
                m.d.comb += vpu.i.payload.a[l].eq(self.kv_resp.payload[l])
            with m.If(vpu.i.valid & vpu.i.ready):
                m.d.sync += resp_beat.eq(incr(resp_beat, nb))
            with m.If(vpu.o.valid):
                m.d.sync += [*at.accumulate(vpu.o.payload.vec), done_beat.eq(incr(done_beat, nb))]
                with m.If(done_beat == nb - 1):
                    m.d.sync += [done_pos.eq(done_pos + 1), at.numer_first.eq(0)]
                    # (against a register: hi - lo - 1 and the compare in series decided the
                    # next state, 10.8 ns before placement, benchmarks/netlist_paths.py)
                    with m.If(done_pos == at.r_last):
                        m.d.sync += sfm_recip.eq(1)
                        m.next = "R_RECIP"
        with m.State("R_RECIP"):
            m.d.comb += sfm.i.valid.eq(1)
            with m.If(sfm.i.ready):
                m.next = "R_RECIP_WAIT"
        with m.State("R_RECIP_WAIT"):
            with m.If(sfm.o.valid):
                kr = sfm.o.payload.exponent
                m.d.sync += [at.recip_m.eq(sfm.o.payload.value),
                             at.pre.eq(Mux(kr > cfg.attend_guard, kr - cfg.attend_guard, 0)),
                             o_beat.eq(0), o_issued.eq(0)]
                m.next = "R_OUT"
        with m.State("R_OUT"):
            m.d.comb += ro.o_issue.eq(~o_issued)
            with m.If(ro.o_issue):
                m.d.sync += o_beat.eq(incr(o_beat, nb))
                with m.If(o_beat == nb - 1):
                    m.d.sync += o_issued.eq(1)
            with m.If(ro.o3_valid & (ro.o3_beat == nb - 1)):
                st.write_slot(m)   # r_dst := the range's result
                m.next = "DISPATCH"

    def _combine_states(self, m, parts: _Parts, st: _Step, cb: _Combine, pg: _Program):
        """COMBINE, MERGE: ⊕ / ⊖ of two states through the MergeUnit, or an empty one's pointer pass."""
        nb, merge, wr = self.cfg.beats, parts.merge, parts.states.write
        rd0_req, rd0_resp, rd1_req, rd1_resp = parts.rd0_req, parts.rd0_resp, parts.rd1_req, parts.rd1_resp
        m_arr, s_arr, ptrs = st.m_arr, st.s_arr, st.ptrs
        c_op, c_a, c_b, c_dst, c_target, c_flag, mo_beat = cb
        # the operands' maxima and sums: the slots that registered copies of c_a and c_b select, in
        # two registered steps (``selected_in_two``), into the MergeUnit's payload in every state (it
        # reads it only with valid, in MERGE). It takes them with its first beat, six cycles or more
        # after COMBINE (the state SRAM's read, the FIFO slice), and no slot is written between.
        # (The slot select and the MergeUnit's m1 - m2 carry chain in one cycle were 10.8 ns before
        # placement, benchmarks/netlist_paths.py; the select by c_b itself, 10.0 ns routed; the 8:1
        # select by a registered copy in one step, 10.6 ns routed)
        sel_a, sel_b = delayed(m, c_a, "c_sel_a"), delayed(m, c_b, "c_sel_b")
        mi, q = merge.i.payload, parts.merge_in
        m.d.comb += [mi.op.eq(c_op),
                     mi.m1.eq(selected_in_two(m, list(m_arr), sel_a, "merge_m1")),
                     mi.s1.eq(selected_in_two(m, list(s_arr), sel_a, "merge_s1")),
                     mi.m2.eq(selected_in_two(m, list(m_arr), sel_b, "merge_m2")),
                     mi.s2.eq(selected_in_two(m, list(s_arr), sel_b, "merge_s2")),
                     mi.o1.eq(q.o.payload[:len(rd0_resp.payload)]), mi.o2.eq(q.o.payload[len(rd0_resp.payload):])]
        with m.State("COMBINE"):
            m.d.sync += [mo_beat.eq(0), c_flag.eq(0)]
            with m.If(st.slot_empty[c_b]):
                m.d.sync += ptrs[c_target].eq(c_a)
                m.next = "DISPATCH"
            with m.Elif(st.slot_empty[c_a] & (c_op == MergeOp.MERGE)):
                m.d.sync += ptrs[c_target].eq(c_b)
                m.next = "DISPATCH"
            with m.Else():
                m.d.sync += pg.reader.eq(Reader.MERGE)
                m.next = "MERGE"
        # both operands' beats through the FIFO slice into the MergeUnit, in every state (only
        # MERGE reads them; the state decode into the MergeUnit's take was 12.2 ns routed)
        m.d.comb += [q.i.valid.eq((pg.reader == Reader.MERGE) & rd0_resp.valid & rd1_resp.valid),
                     q.i.payload.eq(Cat(rd0_resp.payload, rd1_resp.payload)),
                     merge.i.valid.eq(q.o.valid), q.o.ready.eq(merge.i.ready)]
        with m.State("MERGE"):   # (the state SRAM's reads: _state_reads)
            with m.If(merge.o.valid):   # (its beats into the state SRAM: _writes)
                m.d.sync += mo_beat.eq(incr(mo_beat, nb))
                with m.If(mo_beat == nb - 1):
                    st.write_slot(m)   # c_dst := the MergeUnit's result
                    m.d.sync += [c_flag.eq(merge.o.payload.flagged), ptrs[c_target].eq(c_dst),
                                 pg.reader.eq(Reader.NONE)]
                    m.next = "DISPATCH"

    def _entry_states(self, m, parts: _Parts, st: _Step, pg: _Program):
        """ENTRY_READ, ENTRY_WRITE: the matched entry from the entry store; E to slot n mod window."""
        cfg = self.cfg
        nb, wr, rd0_req, rd0_resp = cfg.beats, parts.states.write, parts.rd0_req, parts.rd0_resp
        head, write_slots, m_arr, s_arr = st.head, st.write_slots, st.m_arr, st.s_arr
        e_beat, e_rbeat = pg.e_beat, pg.e_rbeat
        er = self.es_req.payload
        with m.State("ENTRY_READ"):
            m.d.comb += [self.es_req.valid.eq(e_beat < nb), er.write.eq(0), er.head.eq(head),
                         er.slot.eq(st.r_slot), er.beat.eq(e_beat)]
            with m.If(self.es_req.valid & self.es_req.ready):
                m.d.sync += e_beat.eq(e_beat + 1)
            m.d.comb += self.es_resp.ready.eq(1)
            with m.If(self.es_resp.valid):   # (its beats into the state SRAM: _writes)
                m.d.sync += e_rbeat.eq(incr(e_rbeat, nb))
                st.write_slot(m)   # ENT := the entry's
                with m.If(e_rbeat == nb - 1):
                    m.next = "DISPATCH"
        with m.State("ENTRY_WRITE"):   # (the state SRAM's reads: _state_reads)
            pe = st.ptrs[P_E]
            m.d.comb += [self.es_req.valid.eq(rd0_resp.valid),
                         er.write.eq(1), er.head.eq(head), er.slot.eq(write_slots[head]), er.beat.eq(e_rbeat),
                         er.m.eq(m_arr[pe]), er.s.eq(s_arr[pe]), er.o.eq(Mux(st.slot_empty[pe], 0, rd0_resp.payload))]
            with m.If(self.es_req.valid & self.es_req.ready):
                m.d.sync += e_rbeat.eq(incr(e_rbeat, nb))
                with m.If(e_rbeat == nb - 1):
                    m.d.sync += [write_slots[head].eq(incr(write_slots[head], cfg.window)), pg.reader.eq(Reader.NONE)]
                    m.next = "DISPATCH"

    def _emit_state(self, m, parts: _Parts, st: _Step, pg: _Program):
        """EMIT: the output state's beats on ``out``, then the statistics beat."""
        nb, rd0_req, rd0_resp = self.cfg.beats, parts.rd0_req, parts.rd0_resp
        engaged, e_beat, e_rbeat = st.engaged, pg.e_beat, pg.e_rbeat
        with m.State("EMIT"):   # (the state SRAM's reads: _state_reads)
            op_ = self.out.payload
            m.d.comb += [op_.m.eq(st.out_m), op_.s.eq(st.out_s), op_.engaged.eq(engaged), op_.hit.eq(st.hit),
                         op_.fallback.eq(st.fallback), op_.position.eq(Mux(engaged, st.r_pos, 0)),
                         op_.distance.eq(Mux(engaged, st.r_dist, 0)), op_.keys.eq(st.keys),
                         op_.cycles.eq(st.cycles)]
            with m.If(~pg.stats_phase):
                m.d.comb += [self.out.valid.eq(rd0_resp.valid), op_.stats.eq(0), op_.o.eq(Mux(st.out_empty, 0, rd0_resp.payload))]
                with m.If(self.out.valid & self.out.ready):
                    m.d.sync += e_rbeat.eq(incr(e_rbeat, nb))
                    with m.If(e_rbeat == nb - 1):
                        m.d.sync += pg.stats_phase.eq(1)
            with m.Else():
                m.d.comb += [self.out.valid.eq(1), op_.stats.eq(1)]
                with m.If(self.out.ready):
                    m.d.sync += [st.counting.eq(0), pg.reader.eq(Reader.NONE)]
                    m.next = "LOAD"
