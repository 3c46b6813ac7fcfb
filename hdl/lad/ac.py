"""AC: attention computation from the caches (docs/algorithms.md §1.2-1.3, 1.5; golden/lad_tile.py
steps 3, 5 and 6).

Owns caches A (``ac_vpus`` SRAM banks, row ``l`` in bank ``l mod P``, ``beats`` words per row),
B, C, D, E, F and the step's ``N``, ``Z`` (N, B, C, D in LUT RAM, ``LaneFile``; the q.A_r rows in a
memory, ``RowFile``; E, F, Z registers).
Commands on ``cmd``:

- ``QA``: the ``q.A_r`` pass alone (it does not need ``m``): the P VPUs read every row of A (one row
  each per ``beats`` cycles) once the A engine below is idle; the tile sends it as soon as ``q`` is
  loaded, so the pass overlaps EAS and APID. It serves the next ``TERMS`` (``q`` held until then;
  q arrives beat by beat on ``q_load``, AC's own copy: hdl.lad.common.beat_copy);
- ``TERMS`` (with ``m``): ``N_l = round_shift(S q.A_r[l]) - round_shift(m B_l) + round_shift(C_l)``
  (running the ``q.A_r`` pass first unless a ``QA`` since the last cache update did), then ``Z``
  from ``q.D_r`` likewise;
- ``BEATS`` (one beat of ``k``, ``v`` each): ``accumulate`` does ``N += w v``, ``Z += w``;
  ``update`` does ``B += alpha v``, ``C += beta v``, ``D += alpha k``, ``E += alpha``, ``F += beta``
  at once and, after the last beat, hands ``A[l] += g_l k`` (``g_l = round_shift(alpha v_l, 8)``)
  to the **A engine**: AXPYs on the P VPUs, a read-modify-write of every word of the banks
  (``d / P * beats`` cycles), in the background while later commands go on. The engine holds one
  update in progress and one waiting (two copies of ``g`` and ``k``, one for each); while one
  waits, ``cmd`` is not ready.
  Updates reach A in command order, as in the model;
- ``FINISH``: ``(rm, e) = RECIP(clamp(Z))`` through the ``recip_*`` ports, then
  ``o = sat(round_shift(N rm, mf + e))`` leaves on ``out``, one beat per transfer.

The scalar-times-vector arithmetic outside the VPUs (BEATS' products, COMBINE's terms, OUT's
``N rm``) handles ``cfg.ac_group`` lanes a cycle: all ``L`` at the defaults (a beat a cycle);
fewer (``ac_lanes``, the FPGA preset) take ``L / ac_lanes`` cycles a beat with that many times
fewer multipliers and adders, with the same arithmetic (bit-exact with the same model). Each of
the three is a pipeline that takes a lane group a cycle (docs/lad-tile.md, "AC's pipelines"):
registered operands and products (the DSPs' own registers), sums split over two stages, the
variable shift in two, saturation in its own stage; BEATS' read-modify-write of N, B, C, D
reads a group's words two cycles after its command and writes them three cycles after that (four
where its words cycle through at least 5 addresses, b4).
"""
from __future__ import annotations

import math


from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, round_shift, saturate
from ..lib.pipe import csa_sum, delayed, extend, placed, registered_product, split_add, split_sum
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import AcOp, Wires, ac_command_layout, beat_copy, beat_layout, beat_load_signature, recip_resp_layout, require_one_head, sram_banks


def counter_step(outer, inner, outers: int, inners: int) -> list:
    """The statements that step a two-level counter: ``inner`` counts to ``inners`` and wraps,
    ``outer`` (to ``outers``) steps as it wraps."""
    return [inner.eq(incr(inner, inners)),
            outer.eq(incr(outer, outers) if inners == 1 else Mux(inner == inners - 1, incr(outer, outers), outer))]


def registered_write(m: Module, port, en, addr, data):
    """A memory write registered next to its memory: ``port``'s enable, address and data a cycle
    after ``en`` (the address and data loaded only with it, so copies for several memories stay
    distinct registers, not one of wide fan-out); it lands at the end of that cycle."""
    m.d.sync += port.en.eq(en)
    with m.If(en):
        m.d.sync += [port.addr.eq(addr), port.data.eq(data)]


class RowFile:
    """``rows`` values of ``width`` bits (q.A_r) in a memory, written ``put`` rows at a time and read
    ``get`` rows at a time, each in row order from row 0 and back to row 0 after the last: a pass
    of writes, then passes of reads (each counter wraps to where it started, as a shift register
    rotated a full turn would). One memory of lcm(put, get) rows a word, written ``put`` rows at a time
    (``write``: registered next to the memory, it lands at the end of the next cycle); the read
    address is a register (``read_next``): the rows are there the cycle after, and Yosys takes the
    register into the read port, so the memory can be block RAM (at ``ecp5-85f``, two DP16KD). As
    flip-flops, q.A_r was a 64 x 62-bit shift register there, 3,968 flip-flops with a select each."""

    def __init__(self, m: Module, name: str, rows: int, put: int, get: int, width: int):
        u = math.lcm(put, get)
        self._puts, self._gets, self._words = u // put, u // get, rows // u
        m.submodules[name] = mem = memory.Memory(shape=unsigned(u * width), depth=self._words, init=[])
        self._wr, rd = mem.write_port(granularity=put * width), mem.read_port(domain="comb")
        self._w_word, self._w_put = Signal(range(self._words), name=f"{name}_w_word"), Signal(range(self._puts), name=f"{name}_w_put")
        # the read address: the last rows between passes, so that read_next's step reads row 0 first
        self._r_word = Signal(range(self._words), name=f"{name}_r_word", init=self._words - 1)
        self._r_get = Signal(range(self._gets), name=f"{name}_r_get", init=self._gets - 1)
        m.d.comb += rd.addr.eq(self._r_word)
        slices = [rd.data[i * get * width:(i + 1) * get * width] for i in range(self._gets)]
        self.rows = slices[0] if self._gets == 1 else Array(slices)[self._r_get]   # the rows read

    def write(self, m: Module, en, data):
        """Write the next ``put`` rows ``data`` where ``en`` (registered: lands at the end of the next cycle)."""
        wr = self._wr
        m.d.sync += wr.en.eq(Mux(en, Const(1, self._puts) << self._w_put, 0))
        with m.If(en):
            m.d.sync += [wr.addr.eq(self._w_word), wr.data.eq(data.replicate(self._puts))]
            m.d.sync += counter_step(self._w_word, self._w_put, self._words, self._puts)

    def read_next(self, m: Module):
        """Read the next ``get`` rows in the next cycle (in the current control context)."""
        m.d.sync += counter_step(self._r_word, self._r_get, self._words, self._gets)


class LaneFile:
    """A vector of ``beats x groups x group_lanes`` lanes of ``width`` bits (N, B, C, D) in
    ``groups`` LUT-RAM memories, one word per beat each (one write port): memory ``r`` holds lane
    group ``r`` of every beat, so one address reads a whole beat (the words side by side) and a
    write updates one group. The read address is a register (``read_next`` sets it for the next
    cycle): the word is there a cycle after its address was chosen, whatever chose it. A write
    (``write``) is registered per memory (its address, data and enable next to it) and lands at the
    end of the next cycle: reads see it from the cycle after that. No flip-flops for the words and no
    ``beats x groups``-way read multiplexers (N, B, C, D were 15.9k of lad-ac's 34k flip-flops at
    ``ecp5-85f`` as registers). Like the A banks, the words start at zero at configuration, not
    at reset."""

    def __init__(self, m: Module, name: str, beats: int, groups: int, group_lanes: int, width: int):
        self.name, self.groups, self.width = name, groups, width
        mems = [memory.Memory(shape=unsigned(group_lanes * width), depth=beats, init=[]) for _ in range(groups)]
        for r, mem in enumerate(mems):
            m.submodules[f"{name}{r}"] = mem
        reads = [mem.read_port(domain="comb") for mem in mems]
        writes = [mem.write_port() for mem in mems]
        self.read_beat = Signal(range(beats), name=f"{name}_read_beat")
        self.read_group = Signal(range(groups), name=f"{name}_read_group")
        self.write_beat = Signal(range(beats), name=f"{name}_write_beat")
        self.write_group = Signal(range(groups), name=f"{name}_write_group")
        self.write_data = Signal(group_lanes * width, name=f"{name}_write_data")
        self.write_en = Signal(name=f"{name}_write_en")
        for r, (rd, wr) in enumerate(zip(reads, writes)):
            mine = self.write_en & (self.write_group == r)
            m.d.comb += rd.addr.eq(self.read_beat)
            registered_write(m, wr, mine, self.write_beat, self.write_data)
        words = [rd.data for rd in reads]
        self.beat_word = Cat(*words)          # the beat at the read address
        self.group_word = words[0] if groups == 1 else Array(words)[self.read_group]   # its group

    def read_next(self, m: Module, beat, group=0):
        """Read ``beat`` (and ``group`` of it) in the next cycle (in the current control context)."""
        m.d.sync += self.read_beat.eq(beat)
        if self.groups > 1:
            m.d.sync += self.read_group.eq(group)

    def write(self, m: Module, beat, group, data):
        m.d.comb += [self.write_beat.eq(beat), self.write_group.eq(group), self.write_data.eq(data),
                     self.write_en.eq(1)]

    def lane(self, word, i):
        return word[i * self.width:(i + 1) * self.width].as_signed()


class ScalarFile:
    """The ``g`` of two cache updates (``d`` lanes of ``width`` bits each, copy ``buf`` 0 or 1) in
    memories (LUT RAM, or a block RAM where Yosys picks one, as at ecp5-85f), written a lane group
    (``group_lanes``) a cycle by BEATS and read a row (``row_lanes``, one per VPU) a cycle by the A
    engine. Word ``w`` (``u = gcd(group_lanes, row_lanes)`` lanes)
    lives in memory ``w mod M`` (``M = lcm / u`` memories of one write port each), so a group's
    ``a = group_lanes / u`` words go to ``a`` distinct memories (chosen by the group's index mod
    ``b = row_lanes / u``) and a row's ``b`` words come from ``b`` distinct memories (chosen by the
    row's index mod ``a``). Writes are registered per memory (they land at the end of the next
    cycle, as ``LaneFile``'s); the row at the read position (``first_row`` / ``next_row``,
    registers) is in ``row`` two cycles later: each memory's word is registered twice before the
    row's words are chosen (``a > 1``), so that the first flip-flop after a block RAM's pins (at
    ecp5-85f Yosys puts the memories in block RAMs) has no other load and sits next to the RAM.
    With the choice in front of the one row register, the path from the RAM's 5.6 ns pins to the
    far side of the die was the tile's worst (97.05 MHz, seed 1). Yosys makes the read
    synchronous by taking the address registers into the RAM, with a bypass LUT on its pins for a
    write landing in the same cycle, so synth/absorb.py finds no register to move into the RAM's
    output register; a synchronous read port here would let it (docs/lad-tile.md)."""

    def __init__(self, m: Module, d: int, group_lanes: int, row_lanes: int, width: int):
        u = math.gcd(group_lanes, row_lanes)
        a, b = group_lanes // u, row_lanes // u
        self.a, self.b, self.u, self.width = a, b, u, width
        half = d // (u * a * b)                      # words per memory per copy
        mems = [memory.Memory(shape=unsigned(u * width), depth=2 * half, init=[]) for _ in range(a * b)]
        for x, mem in enumerate(mems):
            m.submodules[f"g_file{x}"] = mem
        self.reads = [mem.read_port(domain="comb") for mem in mems]
        self.writes = [mem.write_port() for mem in mems]
        self.half = half
        self.row_hi = Signal(range(half), name="g_row_hi")     # the row's index // a
        self.row_t = Signal(range(a), name="g_row_t")          # ... and mod a
        self.row_buf = Signal(name="g_row_buf")
        m.d.comb += [rd.addr.eq(self.row_buf * half + self.row_hi) for rd in self.reads]
        words = [delayed(m, delayed(m, rd.data, f"g_word{x}_read"), f"g_word{x}")
                 for x, rd in enumerate(self.reads)]
        row_t = delayed(m, delayed(m, self.row_t, "g_row_t_read"), "g_row_t_out")
        rows = [Cat(*words[b * t:b * (t + 1)]) for t in range(a)]
        self.row = rows[0] if a == 1 else Array(rows)[row_t]   # the row_lanes scalars, 2 cycles on

    def write(self, m: Module, valid, group, buf, data):
        """Group ``group`` (``group_lanes`` lanes of ``data``) of copy ``buf``, if ``valid``."""
        a, b, u, w = self.a, self.b, self.u, self.width
        hi, s = (group, 0) if b == 1 else (group // b, group % b)
        for x, wr in enumerate(self.writes):
            registered_write(m, wr, valid & (s == x // a), buf * self.half + hi, data[(x % a) * u * w:][:u * w])

    def first_row(self, m: Module, buf):
        """Read copy ``buf`` from its row 0 on (from the next cycle)."""
        m.d.sync += [self.row_hi.eq(0), self.row_t.eq(0), self.row_buf.eq(buf)]

    def next_row(self, m: Module):
        """Read the next row (from the next cycle)."""
        m.d.sync += self.row_t.eq(incr(self.row_t, self.a))
        with m.If(self.row_t == self.a - 1):
            m.d.sync += self.row_hi.eq(incr(self.row_hi, self.half))


TERMS_STAGES = 8   # registered stages of cache_terms


def cache_terms(m, x, scale: int, mult, y, z, shifts, shape, name: str) -> Signal:
    """``saturate(round_shift(x scale, s0) - round_shift(mult y, s1) + round_shift(z, s2), shape)``
    (docs/algorithms.md §1.2: N's and Z's terms from the caches) in ``TERMS_STAGES`` registered
    stages that advance every cycle: the products' pieces, registered twice (the DSPs' output
    registers and one in the fabric, synth/absorb.py; the operands should be registers), each
    term's rounding sum in two stages (:func:`split_sum`), the three terms' sum in two, the
    saturation, and one more register that carries the result to its users (the saturation next
    to the sum, the users across the die: the critical path at 99.1 MHz without it). The result
    of the operands of cycle c is in the returned register at c + ``TERMS_STAGES``."""
    def rounded(pieces, s, width, nm):
        half = (1 << (s - 1)) if s > 0 else 0
        total = split_sum(m, placed(pieces) + [Const(half, width)], width, nm).as_signed()
        return total >> s if s > 0 else total << -s
    x_pieces = registered_product(m, x, scale, f"{name}_xs")
    m_pieces = registered_product(m, mult, y, f"{name}_my")
    z_reg = delayed(m, delayed(m, z, f"{name}_z0"), f"{name}_z1")
    s0, s1, s2 = shifts
    ta = rounded(x_pieces, s0, len(x) + scale.bit_length() + 2, f"{name}_ta")
    tb = rounded(m_pieces, s1, len(mult) + len(y) + 1, f"{name}_tb")
    tc = rounded([(z_reg, 0)], s2, len(z) + 1, f"{name}_tc")
    width = max(len(ta), len(tb), len(tc)) + 2
    total = split_sum(m, [ta, ~tb, tc, Const(1, 1)], width, f"{name}_sum").as_signed()   # ta - tb + tc
    sat = Signal(shape, name=f"{name}_sat")
    m.d.sync += sat.eq(saturate(total, shape))
    return delayed(m, sat, name)


class Ac(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = require_one_head(cfg)
        super().__init__({
            "q_load": In(beat_load_signature(cfg)),
            "cmd": In(stream.Signature(ac_command_layout(cfg))),
            "out": Out(stream.Signature(beat_layout(cfg))),
            "recip_req": Out(stream.Signature(unsigned(cfg.sfm.recip_in_width))),
            "recip_resp": In(stream.Signature(recip_resp_layout(cfg))),
            "z": Out(signed(cfg.z_width)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        L, nb, d, P = cfg.lanes, cfg.beats, cfg.head_dim, cfg.ac_vpus
        vc = cfg.ac_vpu
        aw, ow, kw, gw = vc.acc_width, vc.in_width, cfg.kv_width, cfg.g_width
        zw, mf = cfg.z_width, cfg.sfm.mantissa_frac
        rows = d // P                      # rows per bank
        words = rows * nb
        vpus = [Vpu(vc) for _ in range(P)]
        banks = [SramBank(sram_banks(cfg)[f"ac.a{p}"]) for p in range(P)]
        for p in range(P):
            m.submodules[f"vpu{p}"] = vpus[p]
            # results always taken (the q.A_r / q.D_r passes and the engine take every one): the
            # VPUs never stall, and their pipelines' enables are not a function of the states
            m.d.comb += vpus[p].o.ready.eq(1)
            m.submodules[f"a_bank{p}"] = banks[p]
        ports = [bank.read_port(0) for bank in banks]

        AL = cfg.ac_group                   # lanes of the scalar-times-vector arithmetic per cycle
        G = L // AL                         # cycles (lane groups) per beat
        assert nb * G >= 4, "BEATS' read-modify-write needs 4 groups between two of one word (validate: nb >= 4)"
        # N, B, C, D: lane files (LUT RAM, a group per write); q.A_r: rows in a memory, P written
        # a cycle in QA, AL read a cycle in COMBINE
        N, B, C, D = (LaneFile(m, name, nb, G, AL, aw) for name in ("n", "b", "c", "d"))
        qa = RowFile(m, "qa", d, P, AL, aw)
        qa_fresh = Signal()                 # qa is q.A_r of the current q and A (no update since)
        # qa_fresh is cleared by registered events alone, a cycle after the command's transfer (by
        # b0's update group, by COMBINE): TERMS, which reads it, waits for BEATS' groups to drain and
        # no QA pass overlaps either. Cleared by the transfer's decode (AC's take, whose nets span
        # the device), it would be the tile's critical path (92.87 MHz, seed 1)
        combine_next = Signal()             # the q.A_r pass was started by TERMS: COMBINE follows
        # QA is marked by a flag set and cleared with the state, not by the state's decode: the VPUs'
        # operands and qa's writes take it as their enable (the decode, through VPU 0's valid,
        # reached qa's ~2,000 flip-flops across the device when they were registers: tile 94.62 MHz)
        qa_shifting = Signal()              # the main FSM is in QA
        # g and k of an update, two copies each in memories: BEATS writes copy g_wsel (the waiting
        # update's), the A engine reads the other (the one in progress); taking an update flips
        # g_wsel (as flip-flops, g and k were copied into the engine's: that copy's enable reached
        # 2,048 flip-flops at ecp5-85f, 79.5 MHz)
        g_file = ScalarFile(m, d, AL, P, gw)
        m.submodules.k_file = k_file = memory.Memory(shape=unsigned(L * kw), depth=2 * nb, init=[])
        k_write, k_read = k_file.write_port(), k_file.read_port(domain="comb")
        g_wsel = Signal()
        k_take = Signal()                   # a beat of an update's k, into copy g_wsel
        waiting = Signal()                  # an update waits (its g and k in copy g_wsel) for the engine
        engine_busy = Signal()
        E, F = Signal(signed(cfg.ef_width)), Signal(signed(cfg.ef_width))
        Z = Signal(signed(zw))
        m.d.comb += self.z.eq(Z)
        # RECIP's operand, Z clamped to the SFM's input range, registered when FINISH is taken (the
        # clamp's compares had run from Z through the tile's mux into the SFM's slice: the tile's
        # critical path without this register, docs/lad-tile.md Synthesis)
        recip_z = Signal(cfg.sfm.recip_in_width)
        m_ref = Signal(signed(cfg.sfm.x_width))
        # three unnamed counters (a generator gives the name tracer no variable names to take)
        issue, resp_cnt, out_cnt = (Signal(range(words + 1)) for _ in range(3))
        e_resp, e_out = (Signal(range(words + 1), name=f"engine_{x}") for x in ("resp", "out"))
        # the A banks' next read: the q.A_r pass's or the engine's (they never overlap), one counter
        # and the banks' address whatever the states (a mux of two counters by both FSMs' states
        # reached the banks' read-during-write compare: 97.5 MHz)
        a_issue = Signal(range(words + 1))
        m.d.comb += [port[0].payload.addr.eq(a_issue) for port in ports]
        rm = Signal(mf + 1)
        S = cfg.scale_raw
        main_busy = Signal()

        s = Wires(cfg=cfg, L=L, nb=nb, P=P, aw=aw, ow=ow, kw=kw, gw=gw, zw=zw, mf=mf, rows=rows,
                   words=words, vpus=vpus, banks=banks, ports=ports, AL=AL, G=G, N=N, B=B, C=C, D=D, qa=qa,
                   qa_fresh=qa_fresh, combine_next=combine_next, qa_shifting=qa_shifting,
                   g_file=g_file, k_write=k_write, k_read=k_read, g_wsel=g_wsel,
                   k_take=k_take, waiting=waiting, engine_busy=engine_busy, E=E, F=F, Z=Z, recip_z=recip_z,
                   m_ref=m_ref, issue=issue, resp_cnt=resp_cnt, out_cnt=out_cnt, e_resp=e_resp, e_out=e_out,
                   a_issue=a_issue, rm=rm, S=S, main_busy=main_busy)

        self._dot_operands(m, s)
        self._beats_pipeline(m, s)
        self._terms_path(m, s)
        self._finish_path(m, s)
        self._vpu_operands(m, s)
        with m.FSM():
            self._idle_state(m, s)
            self._pass_states(m, s)
            self._recip_states(m, s)
        self._recip_response(m, s)
        self._a_engine(m, s)
        return m

    def _dot_operands(self, m, s):
        """The q.A_r and q.D_r passes' VPU operands (q's copy, A's or D's words rounded and
        saturated), with the counters' helpers."""
        nb, G, cfg, L, kw, aw, P, ow, D = s.nb, s.G, s.cfg, s.L, s.kw, s.aw, s.P, s.ow, s.D
        qa_shifting, resp_cnt, vpus, out_cnt = s.qa_shifting, s.resp_cnt, s.vpus, s.out_cnt
        combine_next = s.combine_next
        def split(cnt, n):   # (cnt // n, cnt % n), bit slices when n is a power of two: a word address ->
            if n & (n - 1):  # (local row, beat) with n = nb
                return cnt // n, cnt % n
            s = n.bit_length() - 1
            return cnt[s:], cnt[:s]

        def group_counter(name):   # (beat, group) of a pass over the nb * G lane groups; last; its increment
            beat, sub = Signal(range(nb), name=f"{name}_beat"), Signal(range(G), name=f"{name}_sub")
            last = (beat == nb - 1) & (sub == G - 1)
            return beat, sub, last, counter_step(beat, sub, nb, G)

        in_b, in_sub, _, in_step = group_counter("beats_in")   # BEATS: the beat and group of the next group taken

        def pipe(value, n, name):   # value n cycles later (registers loaded every cycle)
            for i in range(n):
                value = delayed(m, value, f"{name}_d{i}")
            return value

        q_read, = beat_copy(m, cfg, self.q_load, "q_copy", L, 1)   # q, AC's copy (read by the dot passes)

        # The q.A_r and q.D_r passes' VPU operands, registered twice: a word of A (or D) rounded
        # (dot_r), then saturated to the VPU's input format (dot_word), per VPU, with q's beat; the
        # rounding's carry chain runs between two registers (it ran from the RAM's output pins to the
        # VPU's first stage: 58.4 MHz), and the saturation and the choice of A or D in the next
        # stage (with the rounding, from D's registered beat: 86.8 MHz)
        dot_valid, dot_last, dot_q = Signal(), Signal(), Signal(L * kw)
        r_shape = round_shift(Signal(signed(aw)), cfg.cache_dot_shift).shape()
        dot_r = [[Signal(r_shape, name=f"dot_r{p}_{i}") for i in range(L)] for p in range(P)]
        m.d.sync += dot_valid.eq(0)
        dot2_valid, dot2_last, dot2_q = (delayed(m, x, f"dot2_{n}") for x, n in
                                         ((dot_valid, "valid"), (dot_last, "last"), (dot_q, "q")))
        dot_word = [[delayed(m, saturate(dot_r[p][i], signed(ow)), f"dot_word{p}_{i}") for i in range(L)]
                    for p in range(P)]
        d_word, d_valid, d_beat = delayed(m, D.beat_word, "d_word"), Signal(), Signal(range(nb))   # q.D_r: D's beat, read
        m.d.sync += d_valid.eq(0)

        # q's beat for the pass in progress, chosen by qa_shifting rather than by the state's decode
        # (which reached q's LUT-RAM read address across the device: tile 93.66 MHz, seed 1)
        q_beat = Signal(range(nb))
        m.d.comb += [q_beat.eq(Mux(qa_shifting, split(resp_cnt, nb)[1], d_beat)), q_read.addr.eq(q_beat)]

        def dot_load(words):   # VPU p's next beat: A's (D's) words[p], q's beat
            m.d.sync += [dot_valid.eq(1), dot_last.eq(q_beat == nb - 1), dot_q.eq(q_read.data)]
            for p, word in enumerate(words):
                m.d.sync += [dot_r[p][i].eq(round_shift(word[i * aw:(i + 1) * aw].as_signed(), cfg.cache_dot_shift))
                             for i in range(L)]

        def dot_feed(p):             # VPU p's input from those registers (a DOT beat; its results always taken)
            vi = vpus[p].i
            m.d.comb += [vi.valid.eq(dot2_valid), vi.payload.op.eq(VpuOp.DOT), vi.payload.last.eq(dot2_last)]
            m.d.comb += [vi.payload.b[i].eq(dot_word[p][i]) for i in range(L)]   # (q is the VPU's narrow a)
            m.d.comb += [vi.payload.a[i].eq(dot2_q[i * kw:(i + 1) * kw].as_signed()) for i in range(L)]

        def start_qa_pass(then_combine):
            m.d.sync += [resp_cnt.eq(0), out_cnt.eq(0), combine_next.eq(then_combine)]
            m.next = "QA_WAIT"
        s.add(split=split, group_counter=group_counter, in_b=in_b, in_sub=in_sub, in_step=in_step, pipe=pipe,
              d_word=d_word, d_valid=d_valid, d_beat=d_beat, dot_load=dot_load, dot_feed=dot_feed,
              start_qa_pass=start_qa_pass)

    def _beats_pipeline(self, m, s):
        """BEATS' pipeline, a lane group a cycle: the products, g into g_file, the read-modify-write
        of N, B, C, D."""
        k_write, k_take, g_wsel, nb, in_b, G, kw = s.k_write, s.k_take, s.g_wsel, s.nb, s.in_b, s.G, s.kw
        AL, in_sub, qa_fresh, Z, zw, E, cfg, F = s.AL, s.in_sub, s.qa_fresh, s.Z, s.zw, s.E, s.cfg, s.F
        N, B, C, D, gw, g_file, aw = s.N, s.B, s.C, s.D, s.gw, s.g_file, s.aw
        # -- BEATS: a lane group a cycle. b0: the group's operands (and N's, B's, C's, D's read address);
        # b1, b2: the products' pieces (registered twice: DSP and fabric) and the group's words (read in
        # b1, registered); b3: their low halves added; then the high halves and the saturation, into
        # b4's registers (where the groups' addresses cycle through nb * G >= 5 words; else b3's
        # result is the write request), then the write request (it lands a cycle later). A group is
        # read up to four (three) cycles before its predecessors are written; the groups' addresses
        # cycle through nb * G >= 4 words (validate: at least 4 beats), so it never reads a word
        # still to be written.
        c = self.cmd.payload
        registered_write(m, k_write, k_take, g_wsel * nb + in_b, c.k)
        b0_take = Signal()                  # a group taken this cycle
        b0_valid, b0_acc, b0_upd, b0_first = Signal(), Signal(), Signal(), Signal()
        b0_beat, b0_sub = Signal(range(nb)), Signal(range(G))
        b0_w, b0_alpha, b0_beta = Signal.like(c.w), Signal.like(c.alpha), Signal.like(c.beta)
        b0_v = [Signal(signed(kw), name=f"b0_v{j}") for j in range(AL)]
        b0_k = [Signal(signed(kw), name=f"b0_k{j}") for j in range(AL)]
        m.d.sync += b0_valid.eq(b0_take)
        with m.If(b0_take):
            m.d.sync += [b0_acc.eq(c.accumulate), b0_upd.eq(c.update), b0_beat.eq(in_b), b0_sub.eq(in_sub),
                         b0_first.eq((in_b == 0) & (in_sub == G - 1)),
                         b0_w.eq(c.w), b0_alpha.eq(c.alpha), b0_beta.eq(c.beta)]
            for j in range(AL):
                v_j, k_j = ((c.v[j], c.k[j]) if G == 1 else
                            (Array(c.v[r * AL + j] for r in range(G))[in_sub],
                             Array(c.k[r * AL + j] for r in range(G))[in_sub]))
                m.d.sync += [b0_v[j].eq(v_j), b0_k[j].eq(k_j)]
        # Z, E, F with a command's first group (b0): its w, alpha, beta once per command
        with m.If(b0_valid & b0_upd):   # an update changes A: qa no longer is q.A_r
            m.d.sync += qa_fresh.eq(0)
        with m.If(b0_valid & b0_first):
            with m.If(b0_acc):
                m.d.sync += Z.eq(saturate(Z + b0_w, signed(zw)))
            with m.If(b0_upd):
                m.d.sync += [E.eq(saturate(E + b0_alpha, signed(cfg.ef_width))),
                             F.eq(saturate(F + b0_beta, signed(cfg.ef_width)))]
        def advance(stage, signals):   # a group's valid, acc, upd, beat and group, a stage later
            return tuple(delayed(m, s, f"{stage}_{n}") for s, n in zip(signals, ("valid", "acc", "upd", "beat", "sub")))
        b1_valid, b1_acc, b1_upd, b1_beat, b1_sub = advance("b1", (b0_valid, b0_acc, b0_upd, b0_beat, b0_sub))
        b2_valid, b2_acc, b2_upd, b2_beat, b2_sub = advance("b2", (b1_valid, b1_acc, b1_upd, b1_beat, b1_sub))
        with m.If(b0_valid):   # the group's words, read in b1
            for f in (N, B, C, D):
                f.read_next(m, b0_beat, b0_sub)
        words_b2 = {f: delayed(m, f.group_word, f"b2_{n}_word") for f, n in ((N, "n"), (B, "b"), (C, "c"), (D, "d"))}
        prods = [[registered_product(m, s, x[j], f"b_{n}{j}")
                  for s, x, n in ((b0_w, b0_v, "wv"), (b0_alpha, b0_v, "av"), (b0_beta, b0_v, "bv"), (b0_alpha, b0_k, "ak"))]
                 for j in range(AL)]
        # g = round_shift(alpha v, g_shift) of the group, from b2's pieces
        av_width = len(b0_alpha) + kw
        # each g extended to its gw-bit lane of the g file: with narrow coefficients (one PWL interval
        # gives 6-bit alpha) round_shift's result is narrower than gw
        g_new = [extend(round_shift(csa_sum(m, placed(prods[j][1]), av_width, f"b2_av{j}").as_signed(), cfg.g_shift), gw)
                 for j in range(AL)]
        g_file.write(m, b2_valid & b2_upd, b2_beat if G == 1 else b2_beat * G + b2_sub, g_wsel, Cat(*g_new))
        b3_valid, b3_acc, b3_upd, b3_beat, b3_sub = advance("b3", (b2_valid, b2_acc, b2_upd, b2_beat, b2_sub))
        new = {f: [] for f in (N, B, C, D)}
        for j in range(AL):
            for f, pieces, n in ((N, prods[j][0], "n"), (B, prods[j][1], "b"), (C, prods[j][2], "c"), (D, prods[j][3], "d")):
                total = split_add(m, [f.lane(words_b2[f], j)] + placed(pieces), aw + 1, f"b3_{n}{j}").as_signed()
                new[f].append(saturate(total, signed(aw)))
        # the write request's stage: b4, the new words registered before they fan out to the lane
        # files' memories, where the word cycle allows it; else b3
        w_valid, w_acc, w_upd, w_beat, w_sub = b3_valid, b3_acc, b3_upd, b3_beat, b3_sub
        if nb * G >= 5:
            w_valid, w_acc, w_upd, w_beat, w_sub = advance("b4", (b3_valid, b3_acc, b3_upd, b3_beat, b3_sub))
            new = {f: [delayed(m, x, f"b4_{f.name}{j}") for j, x in enumerate(xs)] for f, xs in new.items()}
        g_pending = b0_valid | b1_valid | b2_valid   # groups whose g is not yet written (in b2)
        beats_busy = g_pending | b3_valid | w_valid | delayed(m, w_valid, "bw_landed")   # the writes land a cycle later
        s.add(c=c, b0_take=b0_take, new=new, w_valid=w_valid, w_acc=w_acc, w_upd=w_upd, w_beat=w_beat,
              w_sub=w_sub, g_pending=g_pending, beats_busy=beats_busy)

    def _terms_path(self, m, s):
        """TERMS' arithmetic: COMBINE's N from the caches, a group a cycle, N's, B's, C's, D's
        writes, and Z's terms."""
        group_counter, AL, aw, nb, G, qa, B, C = s.group_counter, s.AL, s.aw, s.nb, s.G, s.qa, s.B, s.C
        S, m_ref, cfg, pipe, w_valid, w_acc, N = s.S, s.m_ref, s.cfg, s.pipe, s.w_valid, s.w_acc, s.N
        w_beat, w_sub, new, w_upd, D, vpus, E, F = s.w_beat, s.w_sub, s.new, s.w_upd, s.D, s.vpus, s.E, s.F
        zw = s.zw
        # -- COMBINE: N = round(S q.A_r) - round(m B) + round(C), a group a cycle: issue (qa's group,
        # B's and C's read address), c1 (the words registered), cache_terms, the write
        c_beat, c_sub, c_last, c_step = group_counter("combine")
        c_issue = Signal()
        c0_valid, c0_last = Signal(), Signal()
        c0_beat, c0_sub = Signal(range(nb)), Signal(range(G))
        m.d.sync += c0_valid.eq(c_issue)
        with m.If(c_issue):
            m.d.sync += [c0_beat.eq(c_beat), c0_sub.eq(c_sub), c0_last.eq(c_last), *c_step]
            qa.read_next(m)
            for f in (B, C):
                f.read_next(m, c_beat, c_sub)
        c1_qa, c1_b, c1_c = (delayed(m, w, f"c1_{n}") for w, n in ((qa.rows, "qa"), (B.group_word, "b"), (C.group_word, "c")))
        n_terms = [cache_terms(m, c1_qa[j * aw:(j + 1) * aw].as_signed(), S, m_ref, B.lane(c1_b, j), C.lane(c1_c, j),
                               cfg.n_cache_shifts, signed(aw), f"n_terms{j}") for j in range(AL)]
        cw_valid, cw_last, cw_beat, cw_sub = (pipe(s, 1 + TERMS_STAGES, f"cw_{n}") for s, n in
                                              ((c0_valid, "valid"), (c0_last, "last"), (c0_beat, "beat"), (c0_sub, "sub")))

        # N's writes: BEATS' (accumulate) or COMBINE's, never in the same cycle
        with m.If(w_valid & w_acc):
            N.write(m, w_beat, w_sub, Cat(*new[N]))
        with m.Elif(cw_valid):
            N.write(m, cw_beat, cw_sub, Cat(*n_terms))
        with m.If(w_valid & w_upd):
            for f in (B, C, D):
                f.write(m, w_beat, w_sub, Cat(*new[f]))

        # -- Z = round(S q.D_r) - round(m E) + round(F): q.D_r on VPU 0, then cache_terms
        z_start = Signal()
        z_terms = cache_terms(m, vpus[0].o.payload.dot, S, m_ref, E, F, cfg.z_cache_shifts, signed(zw), "z_terms")
        z_done = pipe(z_start, TERMS_STAGES, "z_done")
        s.add(c_last=c_last, c_issue=c_issue, cw_valid=cw_valid, cw_last=cw_last, z_start=z_start,
              z_terms=z_terms, z_done=z_done)

    def _finish_path(self, m, s):
        """FINISH's output pipeline: o = sat(round_shift(N rm, mf + e)), a group a cycle, into the
        FIFO to ``out``."""
        group_counter, aw, mf, cfg, N, rm, AL, kw = s.group_counter, s.aw, s.mf, s.cfg, s.N, s.rm, s.AL, s.kw
        pipe, G, L, nb = s.pipe, s.G, s.L, s.nb
        # -- OUT: o = sat(round_shift(N rm, mf + re)), a group a cycle: issue (N's read address), o1
        # (N's group registered), o2 + o3 (the products' pieces, twice), o4 + o5 (the sum with the rounding
        # half, split_sum), o6 (shift by the high bits of the shift, or 0), o7 (by its low bits), o8 (the
        # saturation); groups packed into beats, beats into a FIFO that holds a step's nb beats (empty
        # when OUT starts): out's ready reaches the FIFO, not the pipeline
        o_beat, o_sub, o_last, o_step = group_counter("out")
        # OUT's issue and RECIP_WAIT's response are chosen by flags set and cleared with those states
        # (as qa_shifting): the wait's decode, ANDed with the SFM's valid, enabled the registers it
        # loads and reached them across the device (tile seed 3, 99.42 MHz)
        o_issue, recip_waiting = Signal(), Signal()   # OUT's groups not all issued; the FSM is in RECIP_WAIT
        pw = aw + mf + 2                    # N rm: signed aw x unsigned mf + 1 bits
        fine_bits = 3
        shift_bits = (mf + (1 << cfg.sfm.exponent_width) - 1).bit_length()
        o_shift, o_zero, o_half = Signal(shift_bits), Signal(), Signal(pw + 1)
        with m.If(o_issue):
            N.read_next(m, o_beat, o_sub)
        o1_n = delayed(m, N.group_word, "o1_n")
        o_pieces = [registered_product(m, N.lane(o1_n, j), rm, f"o2_{j}") for j in range(AL)]
        o5_t = [split_sum(m, placed(o_pieces[j]) + [o_half], pw + 1, f"o5_{j}").as_signed() for j in range(AL)]
        o6_t = [delayed(m, Mux(o_zero, 0, o5_t[j] >> Cat(Const(0, fine_bits), o_shift[fine_bits:])), f"o6_{j}")
                for j in range(AL)]
        o7_t = [delayed(m, o6_t[j] >> o_shift[:fine_bits], f"o7_{j}") for j in range(AL)]
        o8_o = [delayed(m, saturate(o7_t[j], signed(kw)), f"o8_{j}") for j in range(AL)]
        o8_valid = pipe(o_issue, 9, "o_valid")   # the issue's group: o1 .. o8 above, after N's read
        o8_sub = pipe(o_sub, 9, "o_sub") if G > 1 else None
        m.submodules.o_fifo = o_fifo = fifo.SyncFIFOBuffered(width=L * kw, depth=nb)
        o_sent = Signal(range(nb))
        if G == 1:
            m.d.comb += [o_fifo.w_en.eq(o8_valid), o_fifo.w_data.eq(Cat(*o8_o))]
        else:
            o_buf = Signal((G - 1) * AL * kw)   # the beat's groups before its last
            with m.If(o8_valid & (o8_sub != G - 1)):
                m.d.sync += o_buf.word_select(o8_sub, AL * kw).eq(Cat(*o8_o))
            m.d.comb += [o_fifo.w_en.eq(o8_valid & (o8_sub == G - 1)), o_fifo.w_data.eq(Cat(o_buf, *o8_o))]
        m.d.comb += [self.out.valid.eq(o_fifo.r_rdy), self.out.payload.eq(o_fifo.r_data), o_fifo.r_en.eq(self.out.ready)]
        out_done = self.out.valid & self.out.ready & (o_sent == nb - 1)
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += o_sent.eq(incr(o_sent, nb))
        s.add(o_last=o_last, o_step=o_step, o_issue=o_issue, recip_waiting=recip_waiting, pw=pw,
              o_shift=o_shift, o_zero=o_zero, o_half=o_half, out_done=out_done)

    def _vpu_operands(self, m, s):
        """busy, RECIP's operand, the VPUs' dot operands and qa's writes (QA), outside the FSM."""
        main_busy, engine_busy, waiting, beats_busy = s.main_busy, s.engine_busy, s.waiting, s.beats_busy
        recip_z, qa_shifting, ports, dot_load = s.recip_z, s.qa_shifting, s.ports, s.dot_load
        d_valid, d_word, qa = s.d_valid, s.d_word, s.qa
        vpus, P = s.vpus, s.P
        m.d.comb += self.busy.eq(main_busy | engine_busy | waiting | beats_busy)

        # RECIP's operand, valid in RECIP alone: the payload does not decode the state, whose
        # decode, gated into each of its bits by the SFM's input mux, sat beside that mux across
        # the device (tile 92.05 MHz, seed 1)
        m.d.comb += self.recip_req.payload.eq(recip_z)

        # the VPUs' operands (outside the FSM, by the same flags: QA's A rows, TERMS_Z's D beats; d_valid
        # is set in TERMS_Z alone)
        with m.If(qa_shifting & ports[0][1].valid):
            dot_load([port[1].payload for port in ports])
        with m.Elif(d_valid):
            dot_load([d_word])
        qa.write(m, qa_shifting & vpus[0].o.valid, Cat(*[vpus[p].o.payload.dot for p in range(P)]))   # P rows of q.A_r

    def _idle_state(self, m, s):
        """IDLE: takes the commands (BEATS' groups into the pipeline, QA, TERMS, FINISH)."""
        G, in_sub, c, waiting, b0_take, beats_busy = s.G, s.in_sub, s.c, s.waiting, s.b0_take, s.beats_busy
        start_qa_pass, m_ref, qa_fresh = s.start_qa_pass, s.m_ref, s.qa_fresh
        recip_z, Z, k_take, in_b, nb, in_step = s.recip_z, s.Z, s.k_take, s.in_b, s.nb, s.in_step
        with m.State("IDLE"):
            beat_done = Const(1) if G == 1 else (in_sub == G - 1)   # a BEATS command's last group
            with m.If(c.op == AcOp.BEATS):
                m.d.comb += [self.cmd.ready.eq(~waiting & beat_done), b0_take.eq(self.cmd.valid & ~waiting)]
            with m.Else():   # the other commands once BEATS' writes (and Z's, E's, F's) are in
                m.d.comb += self.cmd.ready.eq(~waiting & ~beats_busy)
            with m.If(self.cmd.valid & self.cmd.ready):
                with m.Switch(c.op):
                    with m.Case(AcOp.QA):
                        start_qa_pass(0)
                    with m.Case(AcOp.TERMS):   # a QA serves one TERMS (COMBINE clears qa_fresh)
                        m.d.sync += m_ref.eq(c.m)
                        with m.If(qa_fresh):
                            m.next = "COMBINE"
                        with m.Else():
                            start_qa_pass(1)
                    with m.Case(AcOp.FINISH):   # Z is final here (no BEATS write in flight)
                        m.d.sync += recip_z.eq(saturate(Z, recip_z.shape()))
                        m.next = "RECIP"
            with m.If(self.cmd.valid & self.cmd.ready & (c.op == AcOp.BEATS)):   # the beat's transfer (its last group)
                with m.If(c.update):
                    m.d.comb += k_take.eq(1)
                with m.If((in_b == nb - 1) & c.update):
                    m.d.sync += waiting.eq(1)      # the engine takes it when it is free
            with m.If(b0_take):   # the next group (and after a beat's last, the next beat)
                m.d.sync += in_step

    def _pass_states(self, m, s):
        """The q.A_r pass (QA), COMBINE and Z's q.D_r pass (TERMS_Z)."""
        main_busy, engine_busy, waiting, a_issue = s.main_busy, s.engine_busy, s.waiting, s.a_issue
        qa_shifting, P, ports, words, dot_feed = s.qa_shifting, s.P, s.ports, s.words, s.dot_feed
        resp_cnt, vpus, out_cnt, rows, qa_fresh = s.resp_cnt, s.vpus, s.out_cnt, s.rows, s.qa_fresh
        combine_next, c_issue, c_last = s.combine_next, s.c_issue, s.c_last
        issue, D, cw_valid, cw_last, nb, d_valid = s.issue, s.D, s.cw_valid, s.cw_last, s.nb, s.d_valid
        d_beat, z_start, z_done, Z, z_terms = s.d_beat, s.z_start, s.z_done, s.Z, s.z_terms
        with m.State("QA_WAIT"):   # A must hold every update handed over so far
            m.d.comb += main_busy.eq(1)
            with m.If(~engine_busy & ~waiting):
                m.d.sync += [a_issue.eq(0), qa_shifting.eq(1)]   # (the engine is idle and takes nothing this cycle)
                m.next = "QA"
        with m.State("QA"):   # q.A_r[l]: P rows at a time, one beat per cycle, shifted into qa
            m.d.comb += main_busy.eq(1)
            for p in range(P):
                req, resp = ports[p]
                m.d.comb += [req.valid.eq(a_issue < words), resp.ready.eq(1)]
                dot_feed(p)
            with m.If(ports[0][0].valid & ports[0][0].ready):
                m.d.sync += a_issue.eq(a_issue + 1)
            with m.If(ports[0][1].valid):
                m.d.sync += resp_cnt.eq(resp_cnt + 1)
            with m.If(vpus[0].o.valid):
                m.d.sync += out_cnt.eq(out_cnt + 1)
                with m.If(out_cnt == rows - 1):
                    m.d.sync += [qa_fresh.eq(~combine_next), qa_shifting.eq(0)]
                    with m.If(combine_next):
                        m.next = "COMBINE"
                    with m.Else():
                        m.next = "IDLE"
        with m.State("COMBINE"):   # issue the groups (qa's rows AL at a time), wait for the last write
            m.d.comb += [main_busy.eq(1), c_issue.eq(1)]
            m.d.sync += qa_fresh.eq(0)   # qa served its TERMS
            with m.If(c_last):
                m.next = "COMBINE_WAIT"
        with m.State("COMBINE_WAIT"):
            m.d.comb += main_busy.eq(1)
            # issue and D's read address are TERMS_Z's alone: set while waiting, so the last
            # write's arrival drives the state only (shared with them, its decode sat by D's
            # read address across the device: 94.8 MHz, seed 1)
            m.d.sync += issue.eq(0)
            D.read_next(m, 0)
            with m.If(cw_valid & cw_last):
                m.next = "TERMS_Z"
        with m.State("TERMS_Z"):   # q.D_r on VPU 0 (the engine is idle: no update since the pass):
            m.d.comb += main_busy.eq(1)  # D's beats read (d_word), rounded (dot_load), into the VPU
            dot_feed(0)
            with m.If(issue < nb):
                m.d.sync += [issue.eq(issue + 1), d_valid.eq(1), d_beat.eq(issue)]
                D.read_next(m, issue + 1)
            with m.If(vpus[0].o.valid):
                m.d.comb += z_start.eq(1)
                m.next = "TERMS_Z_WAIT"
        with m.State("TERMS_Z_WAIT"):
            m.d.comb += main_busy.eq(1)
            with m.If(z_done):
                m.d.sync += Z.eq(z_terms)
                m.next = "IDLE"

    def _recip_states(self, m, s):
        """FINISH's RECIP of Z and OUT."""
        main_busy, recip_waiting, out_done = s.main_busy, s.recip_waiting, s.out_done
        with m.State("RECIP"):
            m.d.comb += main_busy.eq(1)
            m.d.comb += self.recip_req.valid.eq(1)
            with m.If(self.recip_req.ready):
                m.d.sync += recip_waiting.eq(1)
                m.next = "RECIP_WAIT"
        with m.State("RECIP_WAIT"):   # the response is taken below, by recip_waiting
            m.d.comb += main_busy.eq(1)
            with m.If(self.recip_resp.valid):
                m.next = "OUT"
        with m.State("OUT"):   # the groups are issued below (o_issue); wait for the last beat to leave
            m.d.comb += main_busy.eq(1)
            with m.If(out_done):
                m.next = "IDLE"

    def _recip_response(self, m, s):
        """RECIP's response into the output pipeline's scale and shift, and OUT's issue of the groups."""
        recip_waiting, mf, rm, o_shift, o_zero, pw = s.recip_waiting, s.mf, s.rm, s.o_shift, s.o_zero, s.pw
        o_half, o_issue, o_step, o_last = s.o_half, s.o_issue, s.o_step, s.o_last
        m.d.comb += self.recip_resp.ready.eq(recip_waiting)
        with m.If(recip_waiting & self.recip_resp.valid):
            shift = mf + self.recip_resp.payload.exponent
            m.d.sync += [rm.eq(self.recip_resp.payload.mantissa), o_shift.eq(shift), o_zero.eq(shift > pw),
                         o_half.eq((Const(1, 1) << shift) >> 1), recip_waiting.eq(0), o_issue.eq(1)]
        with m.If(o_issue):   # issue the groups into the output pipeline
            m.d.sync += o_step
            with m.If(o_last):
                m.d.sync += o_issue.eq(0)

    def _a_engine(self, m, s):
        """The A engine: A[l] += g_l k, a read-modify-write of every word of the banks on the P VPUs."""
        nb, g_file, waiting, g_pending, g_wsel = s.nb, s.g_file, s.waiting, s.g_pending, s.g_wsel
        a_issue, e_resp, e_out, engine_busy, split = s.a_issue, s.e_resp, s.e_out, s.engine_busy, s.split
        L, kw, k_read, P, ports, words, vpus, gw = s.L, s.kw, s.k_read, s.P, s.ports, s.words, s.vpus, s.gw
        aw, banks = s.aw, s.banks
        # The A engine: A[l] += g_l k, read-modify-write of every word, P rows at a time. It runs
        # while the FSM above takes commands; the q.A pass waits for it (QA_WAIT), so the two
        # never share the VPUs or the bank ports. It takes a waiting update once BEATS' pipeline
        # has requested g's last group (b2; the write lands in b3, before the engine's first read),
        # flipping g_wsel: it works on the other copy of g and k. g_scalars: the P scalars of the
        # row whose responses come next, g_file's row (2 cycles after its read position moves)
        # registered once more (from the RAM's output pins straight to the VPUs it was 97.1 MHz);
        # g_file moves on at a row's fourth-last beat. The responses come back to back (the banks
        # never stall: their responses are always taken), so the row's last three beats still see
        # its scalars, and the first row's are there by the first response (the banks' latency 3)
        assert nb >= 4, "g_file's next row is chosen at a row's fourth-last beat (validate: nb >= 4)"
        g_scalars = delayed(m, g_file.row, "g_scalars")
        e_buf = Signal()                    # the engine's copy of k
        with m.FSM(name="engine"):
            with m.State("FREE"):
                with m.If(waiting & ~g_pending):
                    g_file.first_row(m, g_wsel)
                    m.d.sync += [g_wsel.eq(~g_wsel), e_buf.eq(g_wsel), waiting.eq(0),
                                 a_issue.eq(0), e_resp.eq(0), e_out.eq(0)]
                    m.next = "UPDATE"
            with m.State("UPDATE"):
                m.d.comb += engine_busy.eq(1)
                row, beat = split(e_resp, nb)
                k_sel = Signal(L * kw)
                m.d.comb += [k_read.addr.eq(e_buf * nb + beat), k_sel.eq(k_read.data)]
                for p in range(P):
                    req, resp = ports[p]
                    m.d.comb += [req.valid.eq(a_issue < words), resp.ready.eq(1)]
                    vi = vpus[p].i
                    m.d.comb += [vi.valid.eq(resp.valid), vi.payload.op.eq(VpuOp.AXPY), vi.payload.last.eq(1),
                                 vi.payload.scalar.eq(g_scalars[p * gw:(p + 1) * gw].as_signed())]
                    for i in range(L):
                        m.d.comb += [vi.payload.a[i].eq(k_sel[i * kw:(i + 1) * kw].as_signed()),
                                     vi.payload.acc[i].eq(resp.payload[i * aw:(i + 1) * aw].as_signed())]
                    with m.If(vpus[p].o.valid):
                        m.d.comb += [banks[p].write.valid.eq(1), banks[p].write.payload.addr.eq(e_out),
                                     banks[p].write.payload.data.eq(vpus[p].o.payload.vec)]
                with m.If(ports[0][0].valid & ports[0][0].ready):
                    m.d.sync += a_issue.eq(a_issue + 1)
                with m.If(ports[0][1].valid):
                    m.d.sync += e_resp.eq(e_resp + 1)
                    with m.If(beat == nb - 4):   # g_scalars hold the next row's from four beats on
                        g_file.next_row(m)
                with m.If(vpus[0].o.valid):
                    m.d.sync += e_out.eq(e_out + 1)
                    with m.If(e_out == words - 1):
                        m.next = "FREE"
