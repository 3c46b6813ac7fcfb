"""AC: attention computation from the caches (docs/algorithms.md §1.2-1.3, 1.5; golden/lad_tile.py
steps 3, 5 and 6).

Owns caches A (``ac_vpus`` SRAM banks, row ``l`` in bank ``l mod P``, ``beats`` words per row),
B, C, D, E, F and the step's ``N``, ``Z`` (N, B, C, D in LUT RAM, ``LaneFile``; E, F, Z registers).
Commands on ``cmd``:

- ``QA``: the ``q.A_r`` pass alone (it does not need ``m``): the P VPUs read every row of A (one row
  each per ``beats`` cycles) once the A engine below is idle; the tile sends it as soon as ``q`` is
  loaded, so the pass overlaps EAS and APID. It serves the next ``TERMS`` (``q`` held until then);
- ``TERMS`` (with ``m``): ``N_l = round_shift(S q.A_r[l]) - round_shift(m B_l) + round_shift(C_l)``
  (running the ``q.A_r`` pass first unless a ``QA`` since the last cache update did), then ``Z``
  from ``q.D_r`` likewise;
- ``BEATS`` (one beat of ``k``, ``v`` each): ``accumulate`` does ``N += w v``, ``Z += w``;
  ``update`` does ``B += alpha v``, ``C += beta v``, ``D += alpha k``, ``E += alpha``, ``F += beta``
  at once and, after the last beat, hands ``A[l] += g_l k`` (``g_l = round_shift(alpha v_l, 8)``)
  to the **A engine**: AXPYs on the P VPUs, a read-modify-write of every word of the banks
  (``d / P * beats`` cycles), in the background while later commands go on. The engine holds one
  update in progress and one waiting (``g``, ``k_buf``); while one waits, ``cmd`` is not ready.
  Updates reach A in command order, as in the model;
- ``FINISH``: ``(rm, e) = RECIP(clamp(Z))`` through the ``recip_*`` ports, then
  ``o = sat(round_shift(N rm, mf + e))`` leaves on ``out``, one beat per transfer.

The scalar-times-vector arithmetic outside the VPUs (BEATS' products, COMBINE's terms, OUT's
``N rm``) handles ``cfg.ac_group`` lanes a cycle: all ``L`` at the defaults (a beat a cycle);
fewer (``ac_lanes``, the FPGA preset) take ``L / ac_lanes`` cycles a beat with that many times
fewer multipliers and adders, with the same arithmetic (bit-exact with the same model).
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import COEF_FRAC, LadTileConfig
from golden.vpu import VpuOp

from ..lib.arith import incr, round_shift, saturate
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import AcOp, ac_command_layout, beat_layout, recip_resp_layout, sram_banks, vector_layout


class LaneFile:
    """A vector of ``beats x groups x group_lanes`` lanes of ``width`` bits (N, B, C, D) in
    ``groups`` LUT-RAM memories, one word per beat each (asynchronous read, one write port): memory
    ``r`` holds lane group ``r`` of every beat, so one address reads a whole beat (the words side by
    side) and a write updates one group. Reads and writes behave as the flat register it replaces
    (read in the cycle, written at the clock edge), without that register's flip-flops and its
    ``beats x groups``-way read multiplexers (N, B, C, D were 15.9k of lad-ac's 34k flip-flops at
    ``ecp5-85f``). Like the A banks, the words start at zero at configuration, not at reset."""

    def __init__(self, m: Module, name: str, beats: int, groups: int, group_lanes: int, width: int):
        self.groups, self.width = groups, width
        mems = [memory.Memory(shape=unsigned(group_lanes * width), depth=beats, init=[]) for _ in range(groups)]
        for r, mem in enumerate(mems):
            m.submodules[f"{name}{r}"] = mem
        reads = [mem.read_port(domain="comb") for mem in mems]
        writes = [mem.write_port() for mem in mems]
        self.read_beat = Signal(range(beats), name=f"{name}_read_beat")
        self.write_beat = Signal(range(beats), name=f"{name}_write_beat")
        self.write_group = Signal(range(groups), name=f"{name}_write_group")
        self.write_data = Signal(group_lanes * width, name=f"{name}_write_data")
        self.write_en = Signal(name=f"{name}_write_en")
        for r, (rd, wr) in enumerate(zip(reads, writes)):
            m.d.comb += [rd.addr.eq(self.read_beat), wr.addr.eq(self.write_beat), wr.data.eq(self.write_data),
                         wr.en.eq(self.write_en & (self.write_group == r))]
        self.words = [rd.data for rd in reads]
        self._group = Array(self.words)

    def read(self, m: Module, beat, group=None):
        """Read ``beat`` (in the current control context): its lanes, or with ``group`` that group's."""
        m.d.comb += self.read_beat.eq(beat)
        if group is None:
            return Cat(*self.words)
        return self.words[0] if self.groups == 1 else self._group[group]

    def write(self, m: Module, beat, group, data):
        m.d.comb += [self.write_beat.eq(beat), self.write_group.eq(group), self.write_data.eq(data),
                     self.write_en.eq(1)]

    def lane(self, word, i):
        return word[i * self.width:(i + 1) * self.width].as_signed()


class Ac(wiring.Component):
    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        super().__init__({
            "q": In(vector_layout(cfg)),
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
            m.submodules[f"a_bank{p}"] = banks[p]
        ports = [bank.read_port(0) for bank in banks]

        AL = cfg.ac_group                   # lanes of the scalar-times-vector arithmetic per cycle
        G = L // AL                         # cycles (lane groups) per beat
        # N, B, C, D: lane files (LUT RAM, a group per write); g, qa: flat registers
        N, B, C, D = (LaneFile(m, name, nb, G, AL, aw) for name in ("n", "b", "c", "d"))
        qa = Signal(d * aw)                 # q.A_r rows, shifted in P at a time
        qa_fresh = Signal()                 # qa is q.A_r of the current q and A (no update since)
        combine_next = Signal()             # the q.A_r pass was started by TERMS: COMBINE follows
        g, g_work = Signal(d * gw), Signal(d * gw)       # the waiting update's g, the engine's
        k_buf = Array(Signal(L * kw, name=f"k_beat{b}") for b in range(nb))
        k_work = Array(Signal(L * kw, name=f"k_work{b}") for b in range(nb))
        waiting = Signal()                  # an update waits in g, k_buf for the engine
        engine_busy = Signal()
        E, F = Signal(signed(cfg.ef_width)), Signal(signed(cfg.ef_width))
        Z = Signal(signed(zw))
        m.d.comb += self.z.eq(Z)
        m_ref = Signal(signed(cfg.sfm.x_width))
        in_b = Signal(range(nb))            # beat index of the next BEATS command
        issue, resp_cnt, out_cnt = Signal(range(words + 1)), Signal(range(words + 1)), Signal(range(words + 1))
        e_issue, e_resp, e_out = (Signal(range(words + 1), name=f"engine_{x}") for x in ("issue", "resp", "out"))
        rm, re = Signal(mf + 1), Signal(cfg.sfm.exponent_width)
        out_b = Signal(range(nb * G + 1))   # COMBINE / OUT: the group (G = 1: the beat)
        in_sub = Signal(range(G))           # BEATS: the group of the command's beat
        o_sub = Signal(range(G))            # OUT: the group of the beat being filled
        o_buf = Signal(L * kw)              # OUT (G > 1): the beat being filled
        sa, sb, sc = cfg.n_cache_shifts
        za, zb, zc = cfg.z_cache_shifts
        S = cfg.scale_raw
        main_busy = Signal()
        m.d.comb += self.busy.eq(main_busy | engine_busy | waiting)

        words_of = {}                      # (flat, index, run) -> the selected run: one mux per triple

        def lane(flat, idx, i, width=aw, per=L):
            """Lane ``i`` of run ``idx`` of ``per`` lanes (a beat, or a group of AL lanes) of a flat register."""
            # An Array of the flat's run slices is a mux per bit; word_select with a variable offset
            # would make every output bit depend on every bit of the flat (Amaranth's Part), which
            # made the netlist's cycle check the bulk of the tile's Verilog generation.
            key = (id(flat), id(idx), per)
            if key not in words_of:
                runs = len(flat) // (per * width)
                words_of[key] = Array(flat[r * per * width:(r + 1) * per * width] for r in range(runs))[idx]
            return words_of[key][i * width:(i + 1) * width].as_signed()

        q_flat = self.q.as_value()

        def q_lane(beat, i):               # element beat * L + i of q
            return lane(q_flat, beat, i, kw)

        def split(cnt, n):   # (cnt // n, cnt % n), bit slices when n is a power of two: a word address ->
            if n & (n - 1):  # (local row, beat) with n = nb; a group index -> (beat, group in it) with n = G
                return cnt // n, cnt % n
            s = n.bit_length() - 1
            return cnt[s:], cnt[:s]

        def start_qa_pass(then_combine):
            m.d.sync += [issue.eq(0), resp_cnt.eq(0), out_cnt.eq(0), combine_next.eq(then_combine)]
            m.next = "QA_WAIT"

        with m.FSM():
            with m.State("IDLE"):
                c = self.cmd.payload
                beat_done = Const(1) if G == 1 else (in_sub == G - 1)   # a BEATS command's last group
                m.d.comb += self.cmd.ready.eq(~waiting & ((c.op != AcOp.BEATS) | beat_done))
                with m.If(self.cmd.valid & ~waiting):
                    with m.Switch(c.op):
                        with m.Case(AcOp.QA):
                            start_qa_pass(0)
                        with m.Case(AcOp.TERMS):
                            m.d.sync += [m_ref.eq(c.m), qa_fresh.eq(0)]     # a QA serves one TERMS
                            with m.If(qa_fresh):
                                m.d.sync += out_b.eq(0)
                                m.next = "COMBINE"
                            with m.Else():
                                start_qa_pass(1)
                        with m.Case(AcOp.BEATS):   # group in_sub of the beat (all of it when G = 1)
                            grp = in_b if G == 1 else in_b * G + in_sub
                            n_old, b_old, c_old, d_old = (f.read(m, in_b, in_sub) for f in (N, B, C, D))
                            n_new, b_new, c_new, d_new, g_new = [], [], [], [], []
                            for j in range(AL):
                                v_j, k_j = ((c.v[j], c.k[j]) if G == 1 else
                                            (Array(c.v[r * AL + j] for r in range(G))[in_sub],
                                             Array(c.k[r * AL + j] for r in range(G))[in_sub]))
                                av = Signal(signed(COEF_FRAC + 2 + kw), name=f"alpha_v{j}")
                                m.d.comb += av.eq(c.alpha * v_j)
                                n_new.append(saturate(N.lane(n_old, j) + c.w * v_j, signed(aw)))
                                b_new.append(saturate(B.lane(b_old, j) + av, signed(aw)))
                                c_new.append(saturate(C.lane(c_old, j) + c.beta * v_j, signed(aw)))
                                d_new.append(saturate(D.lane(d_old, j) + c.alpha * k_j, signed(aw)))
                                g_new.append(round_shift(av, cfg.g_shift)[:gw])
                            with m.If(c.accumulate):
                                N.write(m, in_b, in_sub, Cat(*n_new))
                            with m.If(c.update):
                                B.write(m, in_b, in_sub, Cat(*b_new))
                                C.write(m, in_b, in_sub, Cat(*c_new))
                                D.write(m, in_b, in_sub, Cat(*d_new))
                                m.d.sync += g.word_select(grp, AL * gw).eq(Cat(*g_new))
                            if G > 1:
                                m.d.sync += in_sub.eq(incr(in_sub, G))
                        with m.Case(AcOp.FINISH):
                            m.next = "RECIP"
                    with m.If(self.cmd.valid & self.cmd.ready & (c.op == AcOp.BEATS)):   # the beat's transfer
                        with m.If(c.update):
                            m.d.sync += [k_buf[in_b].eq(c.k), qa_fresh.eq(0)]
                        with m.If(in_b == 0):
                            with m.If(c.accumulate):
                                m.d.sync += Z.eq(saturate(Z + c.w, signed(zw)))
                            with m.If(c.update):
                                m.d.sync += [E.eq(saturate(E + c.alpha, signed(cfg.ef_width))),
                                             F.eq(saturate(F + c.beta, signed(cfg.ef_width)))]
                        m.d.sync += in_b.eq(incr(in_b, nb))
                        with m.If((in_b == nb - 1) & c.update):
                            m.d.sync += waiting.eq(1)      # the engine takes it when it is free

            with m.State("QA_WAIT"):   # A must hold every update handed over so far
                m.d.comb += main_busy.eq(1)
                with m.If(~engine_busy & ~waiting):
                    m.next = "QA"
            with m.State("QA"):   # q.A_r[l]: P rows at a time, one beat per cycle, shifted into qa
                m.d.comb += main_busy.eq(1)
                row, beat = split(resp_cnt, nb)
                for p in range(P):
                    req, resp = ports[p]
                    m.d.comb += [req.valid.eq(issue < words), req.payload.addr.eq(issue), resp.ready.eq(1)]
                    vi = vpus[p].i
                    m.d.comb += [vi.valid.eq(resp.valid), vi.payload.op.eq(VpuOp.DOT), vi.payload.last.eq(beat == nb - 1),
                                 vpus[p].o.ready.eq(1)]
                    for i in range(L):
                        a_lane = resp.payload[i * aw:(i + 1) * aw].as_signed()
                        m.d.comb += [vi.payload.a[i].eq(saturate(round_shift(a_lane, cfg.cache_dot_shift), signed(ow))),
                                     vi.payload.b[i].eq(q_lane(beat, i))]
                with m.If(ports[0][0].valid & ports[0][0].ready):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(ports[0][1].valid):
                    m.d.sync += resp_cnt.eq(resp_cnt + 1)
                with m.If(vpus[0].o.valid):
                    m.d.sync += [out_cnt.eq(out_cnt + 1),
                                 qa.eq(Cat(qa[P * aw:], *[vpus[p].o.payload.dot for p in range(P)]))]
                    with m.If(out_cnt == rows - 1):
                        m.d.sync += [qa_fresh.eq(~combine_next), out_b.eq(0)]
                        with m.If(combine_next):
                            m.next = "COMBINE"
                        with m.Else():
                            m.next = "IDLE"
            with m.State("COMBINE"):   # N = round(S q.A_r) - round(m B) + round(C), a group per cycle
                m.d.comb += main_busy.eq(1)
                beat, sub = split(out_b, G)
                b_word, c_word = B.read(m, beat, sub), C.read(m, beat, sub)
                terms = [saturate(round_shift(lane(qa, out_b, j, per=AL) * S, sa)
                                  - round_shift(m_ref * B.lane(b_word, j), sb)
                                  + round_shift(C.lane(c_word, j), sc), signed(aw)) for j in range(AL)]
                N.write(m, beat, sub, Cat(*terms))
                m.d.sync += out_b.eq(out_b + 1)
                with m.If(out_b == nb * G - 1):
                    m.d.sync += issue.eq(0)
                    m.next = "TERMS_Z"
            with m.State("TERMS_Z"):   # Z from q.D_r on VPU 0 (the engine is idle: no update since the pass)
                m.d.comb += main_busy.eq(1)
                vi = vpus[0].i
                m.d.comb += [vi.valid.eq(issue < nb), vi.payload.op.eq(VpuOp.DOT), vi.payload.last.eq(issue == nb - 1),
                             vpus[0].o.ready.eq(1)]
                d_beat = D.read(m, issue)
                for i in range(L):
                    m.d.comb += [vi.payload.a[i].eq(saturate(round_shift(D.lane(d_beat, i), cfg.cache_dot_shift), signed(ow))),
                                 vi.payload.b[i].eq(q_lane(issue, i))]
                with m.If(vi.valid & vi.ready):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(vpus[0].o.valid):
                    qd = vpus[0].o.payload.dot
                    m.d.sync += Z.eq(saturate(round_shift(qd * S, za) - round_shift(m_ref * E, zb) + round_shift(F, zc),
                                              signed(zw)))
                    m.next = "IDLE"

            with m.State("RECIP"):
                m.d.comb += main_busy.eq(1)
                zmax = (1 << cfg.sfm.recip_in_width) - 1
                m.d.comb += [self.recip_req.valid.eq(1),
                             self.recip_req.payload.eq(Mux(Z < 0, 0, Mux(Z > zmax, zmax, Z)))]
                with m.If(self.recip_req.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.comb += [main_busy.eq(1), self.recip_resp.ready.eq(1)]
                with m.If(self.recip_resp.valid):
                    m.d.sync += [rm.eq(self.recip_resp.payload.mantissa), re.eq(self.recip_resp.payload.exponent),
                                 out_b.eq(0)]
                    m.next = "OUT"
            if G == 1:
                with m.State("OUT"):
                    m.d.comb += [main_busy.eq(1), self.out.valid.eq(1)]
                    n_beat = N.read(m, out_b)
                    for i in range(L):
                        m.d.comb += self.out.payload[i].eq(saturate(round_shift(N.lane(n_beat, i) * rm, mf + re),
                                                                    signed(kw)))
                    with m.If(self.out.ready):
                        m.d.sync += out_b.eq(out_b + 1)
                        with m.If(out_b == nb - 1):
                            m.next = "IDLE"
            else:
                with m.State("OUT"):        # the beat's groups into o_buf, one a cycle
                    m.d.comb += main_busy.eq(1)
                    n_word = N.read(m, *split(out_b, G))
                    o_grp = [saturate(round_shift(N.lane(n_word, j) * rm, mf + re), signed(kw))
                             for j in range(AL)]
                    m.d.sync += [o_buf.word_select(o_sub, AL * kw).eq(Cat(*o_grp)), out_b.eq(out_b + 1),
                                 o_sub.eq(incr(o_sub, G))]
                    with m.If(o_sub == G - 1):
                        m.next = "OUT_SEND"
                with m.State("OUT_SEND"):
                    m.d.comb += [main_busy.eq(1), self.out.valid.eq(1), self.out.payload.eq(o_buf)]
                    with m.If(self.out.ready):
                        with m.If(out_b == nb * G):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "OUT"

        # The A engine: A[l] += g_l k, read-modify-write of every word, P rows at a time. It runs
        # while the FSM above takes commands; the q.A_r pass waits for it (QA_WAIT), so the two
        # never share the VPUs or the bank ports.
        with m.FSM(name="engine"):
            with m.State("FREE"):
                with m.If(waiting):
                    m.d.sync += [g_work.eq(g), waiting.eq(0), e_issue.eq(0), e_resp.eq(0), e_out.eq(0)]
                    m.d.sync += [k_work[b].eq(k_buf[b]) for b in range(nb)]
                    m.next = "UPDATE"
            with m.State("UPDATE"):
                m.d.comb += engine_busy.eq(1)
                row, beat = split(e_resp, nb)
                k_sel = Signal(L * kw)
                m.d.comb += k_sel.eq(k_work[beat])
                for p in range(P):
                    req, resp = ports[p]
                    m.d.comb += [req.valid.eq(e_issue < words), req.payload.addr.eq(e_issue), resp.ready.eq(1)]
                    vi = vpus[p].i
                    m.d.comb += [vi.valid.eq(resp.valid), vi.payload.op.eq(VpuOp.AXPY), vi.payload.last.eq(1),
                                 vi.payload.scalar.eq(g_work[p * gw:(p + 1) * gw].as_signed()), vpus[p].o.ready.eq(1)]
                    for i in range(L):
                        m.d.comb += [vi.payload.a[i].eq(k_sel[i * kw:(i + 1) * kw].as_signed()),
                                     vi.payload.acc[i].eq(resp.payload[i * aw:(i + 1) * aw].as_signed())]
                    with m.If(vpus[p].o.valid):
                        m.d.comb += [banks[p].write.valid.eq(1), banks[p].write.payload.addr.eq(e_out),
                                     banks[p].write.payload.data.eq(vpus[p].o.payload.vec)]
                with m.If(ports[0][0].valid & ports[0][0].ready):
                    m.d.sync += e_issue.eq(e_issue + 1)
                with m.If(ports[0][1].valid):
                    m.d.sync += e_resp.eq(e_resp + 1)
                    with m.If(beat == nb - 1):   # next row: the next P scalars
                        m.d.sync += g_work.eq(g_work >> (P * gw))
                with m.If(vpus[0].o.valid):
                    m.d.sync += e_out.eq(e_out + 1)
                    with m.If(e_out == words - 1):
                        m.next = "FREE"
        return m
