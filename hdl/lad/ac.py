"""AC: attention computation from the caches (ALGORITHMS.md §1.2-1.3, 1.5; golden/lad_tile.py
steps 3, 5 and 6).

Owns caches A (``ac_vpus`` SRAM banks, row ``l`` in bank ``l mod P``, ``beats`` words per row),
B, C, D, E, F and the step's ``N``, ``Z`` (registers). Commands on ``cmd``:

- ``TERMS`` (with ``m``): ``N_l = round_shift(S q.A_r[l]) - round_shift(m B_l) + round_shift(C_l)``
  on the P VPUs in parallel (one row each per ``beats`` cycles), then ``Z`` from ``q.D_r`` likewise;
- ``BEATS`` (one beat of ``k``, ``v`` each): ``accumulate`` does ``N += w v``, ``Z += w``;
  ``update`` does ``B += alpha v``, ``C += beta v``, ``D += alpha k``, ``E += alpha``, ``F += beta``
  and, after the last beat, ``A[l] += g_l k`` with ``g_l = round_shift(alpha v_l, 8)`` on the P
  VPUs (AXPY, read-modify-write of the banks);
- ``FINISH``: ``(rm, e) = RECIP(clamp(Z))`` through the ``recip_*`` ports, then
  ``o = sat(round_shift(N rm, mf + e))`` leaves on ``out``, one beat per transfer.
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import CACHE_FRAC, COEF_FRAC, LadTileConfig
from golden.sram import SramConfig
from golden.vpu import OP_AXPY, OP_DOT

from ..lib.arith import round_shift, saturate
from ..lib.sram import SramBank
from ..lib.vpu import Vpu
from .common import AC_BEATS, AC_FINISH, AC_TERMS, ac_command_layout, beat_layout, vector_layout
from .eas import recip_resp_layout

G_SHIFT = COEF_FRAC + 8 - 16   # g = alpha v (frac 24) rounded to frac 16


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
        aw, ow, kw = vc.acc_width, vc.in_width, cfg.kv_width
        zw, mf = cfg.z_width, cfg.sfm.mantissa_frac
        rows = d // P                      # rows per bank
        words = rows * nb
        vpus = [Vpu(vc) for _ in range(P)]
        banks = [SramBank(SramConfig(depth=max(2, words), width=L * aw)) for _ in range(P)]
        for p in range(P):
            m.submodules[f"vpu{p}"] = vpus[p]
            m.submodules[f"a_bank{p}"] = banks[p]
        ports = [bank.read_port(0) for bank in banks]

        def regs(name, width, count=d):
            return Array(Signal(signed(width), name=f"{name}{i}") for i in range(count))

        N, B, C, D = regs("n", aw), regs("b", aw), regs("c", aw), regs("d", aw)
        g = regs("g", 24)
        k_buf = Array(Signal(L * kw, name=f"k_beat{b}") for b in range(nb))
        E, F = Signal(signed(40)), Signal(signed(40))
        Z = Signal(signed(zw))
        m.d.comb += self.z.eq(Z)
        m_ref = Signal(signed(cfg.sfm.x_width))
        in_b = Signal(range(nb))            # beat index of the next BEATS command
        upd = Signal()
        issue, resp_cnt, out_cnt = Signal(range(words + 1)), Signal(range(words + 1)), Signal(range(words + 1))
        rm, re = Signal(mf + 1), Signal(cfg.sfm.exponent_width)
        out_b = Signal(range(nb))
        sa, sb, sc = cfg.n_cache_shifts
        za, zb, zc = cfg.z_cache_shifts
        S = cfg.scale_raw

        def addr_row(cnt):                 # word address -> (local row, beat)
            return cnt // nb if nb & (nb - 1) else cnt >> (nb.bit_length() - 1), cnt % nb

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                c = self.cmd.payload
                with m.If(self.cmd.valid):
                    with m.Switch(c.op):
                        with m.Case(AC_TERMS):
                            m.d.sync += [m_ref.eq(c.m), issue.eq(0), resp_cnt.eq(0), out_cnt.eq(0)]
                            m.next = "TERMS"
                        with m.Case(AC_BEATS):
                            for i in range(L):
                                l = in_b * L + i
                                av = Signal(signed(COEF_FRAC + 2 + kw), name=f"alpha_v{i}")
                                m.d.comb += av.eq(c.alpha * c.v[i])
                                with m.If(c.accumulate):
                                    m.d.sync += N[l].eq(saturate(N[l] + c.w * c.v[i], signed(aw)))
                                with m.If(c.update):
                                    m.d.sync += [B[l].eq(saturate(B[l] + av, signed(aw))),
                                                 C[l].eq(saturate(C[l] + c.beta * c.v[i], signed(aw))),
                                                 D[l].eq(saturate(D[l] + c.alpha * c.k[i], signed(aw))),
                                                 g[l].eq(round_shift(av, G_SHIFT))]
                            with m.If(c.update):
                                m.d.sync += k_buf[in_b].eq(c.k)
                            with m.If(in_b == 0):
                                with m.If(c.accumulate):
                                    m.d.sync += Z.eq(saturate(Z + c.w, signed(zw)))
                                with m.If(c.update):
                                    m.d.sync += [E.eq(saturate(E + c.alpha, signed(40))),
                                                 F.eq(saturate(F + c.beta, signed(40)))]
                            m.d.sync += in_b.eq(Mux(in_b == nb - 1, 0, in_b + 1))
                            with m.If((in_b == nb - 1) & c.update):
                                m.d.sync += [issue.eq(0), resp_cnt.eq(0), out_cnt.eq(0)]
                                m.next = "UPDATE"
                        with m.Case(AC_FINISH):
                            m.next = "RECIP"

            with m.State("TERMS"):   # N_l from q.A_r[l]: P rows at a time, one beat per cycle
                m.d.comb += self.busy.eq(1)
                row, beat = addr_row(resp_cnt)
                for p in range(P):
                    req, resp = ports[p]
                    m.d.comb += [req.valid.eq(issue < words), req.payload.addr.eq(issue), resp.ready.eq(1)]
                    lanes = [saturate(round_shift(resp.payload[i * aw:(i + 1) * aw].as_signed(), cfg.cache_dot_shift),
                                      signed(ow)) for i in range(L)]
                    vi = vpus[p].i
                    m.d.comb += [vi.valid.eq(resp.valid), vi.payload.op.eq(OP_DOT), vi.payload.last.eq(beat == nb - 1),
                                 vpus[p].o.ready.eq(1)]
                    for i in range(L):
                        m.d.comb += [vi.payload.a[i].eq(lanes[i]), vi.payload.b[i].eq(self.q[beat * L + i])]
                    out_row = out_cnt * P + p
                    with m.If(vpus[p].o.valid):
                        qa = vpus[p].o.payload.dot
                        m.d.sync += N[out_row].eq(saturate(
                            round_shift(qa * S, sa) - round_shift(m_ref * B[out_row], sb) + round_shift(C[out_row], sc),
                            signed(aw)))
                with m.If(ports[0][0].valid & ports[0][0].ready):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(ports[0][1].valid):
                    m.d.sync += resp_cnt.eq(resp_cnt + 1)
                with m.If(vpus[0].o.valid):
                    m.d.sync += out_cnt.eq(out_cnt + 1)
                    with m.If(out_cnt == rows - 1):
                        m.d.sync += issue.eq(0)
                        m.next = "TERMS_Z"
            with m.State("TERMS_Z"):   # Z from q.D_r on VPU 0
                m.d.comb += self.busy.eq(1)
                vi = vpus[0].i
                m.d.comb += [vi.valid.eq(issue < nb), vi.payload.op.eq(OP_DOT), vi.payload.last.eq(issue == nb - 1),
                             vpus[0].o.ready.eq(1)]
                for i in range(L):
                    m.d.comb += [vi.payload.a[i].eq(saturate(round_shift(D[issue * L + i], cfg.cache_dot_shift), signed(ow))),
                                 vi.payload.b[i].eq(self.q[issue * L + i])]
                with m.If(vi.valid & vi.ready):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(vpus[0].o.valid):
                    qd = vpus[0].o.payload.dot
                    m.d.sync += Z.eq(saturate(round_shift(qd * S, za) - round_shift(m_ref * E, zb) + round_shift(F, zc),
                                              signed(zw)))
                    m.next = "IDLE"

            with m.State("UPDATE"):   # A[l] += g_l k: read-modify-write of every word, P rows at a time
                m.d.comb += self.busy.eq(1)
                row, beat = addr_row(resp_cnt)
                k_sel = Signal(L * kw)
                m.d.comb += k_sel.eq(k_buf[beat])
                for p in range(P):
                    req, resp = ports[p]
                    m.d.comb += [req.valid.eq(issue < words), req.payload.addr.eq(issue), resp.ready.eq(1)]
                    vi = vpus[p].i
                    m.d.comb += [vi.valid.eq(resp.valid), vi.payload.op.eq(OP_AXPY), vi.payload.last.eq(1),
                                 vi.payload.scalar.eq(g[row * P + p]), vpus[p].o.ready.eq(1)]
                    for i in range(L):
                        m.d.comb += [vi.payload.a[i].eq(k_sel[i * kw:(i + 1) * kw].as_signed()),
                                     vi.payload.acc[i].eq(resp.payload[i * aw:(i + 1) * aw].as_signed())]
                    with m.If(vpus[p].o.valid):
                        m.d.comb += [banks[p].write.valid.eq(1), banks[p].write.payload.addr.eq(out_cnt),
                                     banks[p].write.payload.data.eq(vpus[p].o.payload.vec)]
                with m.If(ports[0][0].valid & ports[0][0].ready):
                    m.d.sync += issue.eq(issue + 1)
                with m.If(ports[0][1].valid):
                    m.d.sync += resp_cnt.eq(resp_cnt + 1)
                with m.If(vpus[0].o.valid):
                    m.d.sync += out_cnt.eq(out_cnt + 1)
                    with m.If(out_cnt == words - 1):
                        m.next = "IDLE"

            with m.State("RECIP"):
                m.d.comb += self.busy.eq(1)
                zmax = (1 << cfg.sfm.recip_in_width) - 1
                m.d.comb += [self.recip_req.valid.eq(1),
                             self.recip_req.payload.eq(Mux(Z < 0, 0, Mux(Z > zmax, zmax, Z)))]
                with m.If(self.recip_req.ready):
                    m.next = "RECIP_WAIT"
            with m.State("RECIP_WAIT"):
                m.d.comb += [self.busy.eq(1), self.recip_resp.ready.eq(1)]
                with m.If(self.recip_resp.valid):
                    m.d.sync += [rm.eq(self.recip_resp.payload.mantissa), re.eq(self.recip_resp.payload.exponent),
                                 out_b.eq(0)]
                    m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [self.busy.eq(1), self.out.valid.eq(1)]
                for i in range(L):
                    m.d.comb += self.out.payload[i].eq(
                        saturate(round_shift(N[out_b * L + i] * rm, mf + re), signed(kw)))
                with m.If(self.out.ready):
                    m.d.sync += out_b.eq(out_b + 1)
                    with m.If(out_b == nb - 1):
                        m.d.sync += [Z.eq(0)] + [N[l].eq(0) for l in range(d)]
                        m.next = "IDLE"
        return m
