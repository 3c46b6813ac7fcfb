"""LAD tile: one attention head's decode steps (docs/algorithms.md §1; golden.lad_tile.LadTileModel).

The step sequencer of docs/lad-tile.md around EAS, APID, MD and AC (each a component with
its own SRAM banks and share of the VPU pool) and one SFM:

1. ``step_in``: q, k_n, v_n (``beats`` transfers); 2. EAS: center update, center scores,
``s_n``, while AC runs the ``q.A`` pass (``QA``, sent as soon as q is loaded); 3. APID pass A:
``s^_i`` and their max, ``m = max(., s_n)``; 4. AC TERMS: N, Z from the caches; 5. APID pass B
with MD: candidates read ``k_i`` (and actives ``v_i``) over ``kv_req``/``kv_resp``, corrections and
mode-change updates go to AC (whose A engine applies the updates in the background); 6. the new
position's PWL value (SFM EXP) into N, Z; 7. AC FINISH: ``o`` on ``out`` with the step's
statistics (``cycles``: the step's whole period, docs/lad-tile.md "Cycles"); 8. absorption of
position n (AC cache update, APID metadata).

Past ``max_positions`` a step is the exact pass: the query goes to a dense baseline
(``hdl.lad.dense.DenseAttention`` at ``cfg.fallback()``), which owns the KV port for the step and
reads positions ``0..n``; its ``o``, ``m``, ``Z`` leave with ``path = EXACT``. Past
``kv_positions`` a step returns ``o = 0`` with ``path = BEYOND`` (docs/lad-tile.md, "Past max_positions").
With ``kv_positions = max_positions`` there is no exact pass (no dense baseline is built): every
step past ``max_positions`` is BEYOND.

A tile per KV group (``group`` g > 1; docs/lad-tile.md, "Compact centers and a tile per KV group")
runs the g query heads in lockstep: a step is ``g * beats`` transfers on ``step_in`` (head h's q in
transfers ``h * beats ..``; k_n and v_n in the first ``beats``), EAS and APID serve the group (one
center table, one lookup per position), each head has its own MD and AC, the MDs' KV requests
share the port through :class:`hdl.lad.kv_union.KvUnion`, the SFM serves the heads in turn, and
``out`` carries the heads' o beats in head order, each with its head's statistics. The exact pass
is the group-aware dense block.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from amaranth import Array, Cat, Const, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.lad_tile import LadTileConfig, StepPath
from golden.sfm import SfmOp

from ..lib.arith import incr, index_width, saturate
from ..lib.parts import add_part
from ..lib.sfm import Sfm, sfm_in_layout
from ..lib.slice import FifoSlice, RegisterSlice
from .ac import Ac
from .apid import Apid
from .common import AcOp, ac_command_layout, beat_copy, beat_layout, beat_load_signature, coef_width, head_values
from .dense import DenseAttention, kv_request_layout
from .eas import Eas
from .kv_union import KvUnion
from .md import Md


def head_name(name: str, h: int) -> str:
    """The name of query head h's copy of a part or signal (head 0's: the name itself)."""
    return name if h == 0 else f"{name}{h}"


def step_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({"q": beat_layout(cfg), "k": beat_layout(cfg), "v": beat_layout(cfg)})


def tile_kv_request_layout(cfg: LadTileConfig) -> data.StructLayout:
    """The tile's KV-memory requests: positions up to ``kv_positions`` (the exact pass reads them all)."""
    return kv_request_layout(cfg.fallback())


def tile_out_layout(cfg: LadTileConfig) -> data.StructLayout:
    return data.StructLayout({
        "o": beat_layout(cfg),
        "position": unsigned(cfg.step_position_width), "candidates": unsigned(cfg.position_width),
        "active": unsigned(cfg.position_width), "false_alarms": unsigned(cfg.position_width),
        "mode_changes": unsigned(cfg.position_width), "centers": unsigned(cfg.center_width + 1),
        "new_center": unsigned(1), "path": StepPath,
        "m": signed(cfg.sfm.x_width), "z": signed(max(cfg.z_width, cfg.fallback().sfm_out_width_sum + 1)),
        "kv_beats": unsigned(32), "cycles": unsigned(32),
        **({"head": unsigned(index_width(cfg.group))} if cfg.group > 1 else {}),
    })


class _Step(NamedTuple):
    """What the sequencer's states share: the parts (per query head: MD, AC, their streams and
    registers, lists of ``group``), AC's and the SFM's request streams, the step's beat copies and
    registers (those from ``kv_beats`` on set by ``LadTile._step_registers``)."""
    ac: list
    eas: Eas
    md: list
    apid: Apid
    sfm: Sfm
    exact: DenseAttention | None
    ac_cmd: list
    sfm_i: object
    md_corr: list
    corr_to_ac: Signal
    loads: dict
    beat: Signal
    head: Signal
    q_buf: list
    k_buf: object
    v_buf: object
    m_ref: list
    exact_pass: Signal
    n: Signal = None
    key: Signal = None
    p_new: list = None
    r_new: list = None
    candidates: list = None
    snap: list = None
    counts: list = None
    kv_beats: Signal = None
    cycles: Signal = None
    absorb_sent: Signal = None
    step_done: Signal = None
    env_wait: Signal = None
    cmd: list = None
    sent: Signal = None
    qa_sent: Signal = None
    send_qa: list = None
    absorb_payload: list = None


class LadTile(wiring.Component):
    """``step_in`` -> (``kv_req`` / ``kv_resp``) -> ``out``; one decode step at a time."""

    def __init__(self, cfg: LadTileConfig):
        self.cfg = cfg
        super().__init__({
            "step_in": In(stream.Signature(step_layout(cfg))),
            "kv_req": Out(stream.Signature(tile_kv_request_layout(cfg))),
            "kv_resp": In(stream.Signature(beat_layout(cfg))),
            "out": Out(stream.Signature(tile_out_layout(cfg))),
        })

    def elaborate(self, platform):
        cfg, m = self.cfg, Module()
        L, nb, g = cfg.lanes, cfg.beats, cfg.group
        sfm_cfg = cfg.sfm
        xw = sfm_cfg.x_width
        # the modules are parts (hdl.lib.parts): converted to Verilog apart and in parallel, the
        # largest first (AC, EAS, the exact pass). A group's heads: an MD and an AC each (at group 1)
        one = dataclasses.replace(cfg, group=1) if g > 1 else cfg
        ac, md = [Ac(one) for _ in range(g)], [Md(one) for _ in range(g)]
        eas, apid, sfm = Eas(cfg), Apid(cfg), Sfm(sfm_cfg)
        exact_path = cfg.kv_positions > cfg.max_positions   # else a step past max_positions is BEYOND at once
        exact = DenseAttention(cfg.fallback()) if exact_path else None
        # (the heads' ACs are instances of one module "ac", their MDs of "md": each converted once)
        for name, part, module in (*((head_name("ac", h), a, "ac") for h, a in enumerate(ac)), ("eas", eas, None),
                                   ("exact", exact, None), *((head_name("md", h), d, "md") for h, d in enumerate(md)),
                                   ("apid", apid, None), ("sfm", sfm, None)):
            if part is not None:
                add_part(m, name, part, module)
        # between the blocks, for the clock (docs/synthesis.md): AC's commands and the SFM's requests
        # go through register slices (registered valid, payload and ready; one cycle each; AC's a FIFO
        # slice, whose payload registers AC's late ready does not enable), and the
        # SFM never stalls (every requester waits for its result with ready high), so no ready
        # crosses from AC or the SFM through the sequencer into MD, EAS or AC (AC's cmd.ready ->
        # MD's corr.ready -> kv_resp.ready was two long routes in series)
        # AC's ready drives no payload enables; what AC decodes (op, update, accumulate) leaves flip-flops
        ac_cmd_slices = [FifoSlice(ac_command_layout(cfg), flop_fields=("op", "update", "accumulate")) for _ in range(g)]
        for h, (slice_, a) in enumerate(zip(ac_cmd_slices, ac)):
            m.submodules[head_name("ac_cmd", h)] = slice_
            wiring.connect(m, slice_.o, a.cmd)
        m.submodules.sfm_in = sfm_in_slice = RegisterSlice(sfm_in_layout(sfm_cfg))
        wiring.connect(m, sfm_in_slice.o, sfm.i)
        m.d.comb += sfm.o.ready.eq(1)
        ac_cmd, sfm_i = [slice_.i for slice_ in ac_cmd_slices], sfm_in_slice.i
        # MD's corrections reach AC's slice through one more slice next to MD, and the mux picks them
        # by a registered flag (set entering CLASSIFY_WAIT, cleared leaving MD_DRAIN), not by the
        # decoded FSM state: the critical path ran from the state through that select and MD's FIFO
        # across the die to AC's slice (docs/lad-tile.md, Synthesis)
        md_corr = [RegisterSlice(ac_command_layout(cfg)) for _ in range(g)]
        for h, (corr, d) in enumerate(zip(md_corr, md)):
            m.submodules[head_name("md_corr", h)] = corr
            wiring.connect(m, d.corr, corr.i)
        corr_to_ac = Signal()

        # LOAD broadcasts the step's beats: q to EAS, MD, AC and the tile's copy (the exact pass's
        # query), k_n to EAS and the tile's (the absorption), v_n to the tile's; each keeps its own
        # copy (hdl.lad.common.beat_copy), read at the tile's ``beat``. A group's step: head h's q in
        # the transfers of ``head`` h (to its MD, AC and copy, and to EAS with its head), k_n and v_n
        # in head 0's
        beat, head = Signal(range(nb)), Signal(range(g))
        loads = {**{head_name("q", h): beat_load_signature(cfg).create(path=(f"{head_name('q', h)}_load",)) for h in range(g)},
                 **{name: beat_load_signature(cfg).create(path=(f"{name}_load",)) for name in "kv"}}
        q_loads = [loads[head_name("q", h)] for h in range(g)]
        for h, load in enumerate(q_loads):
            m.d.comb += [x for port in (md[h].q_load, ac[h].q_load) for x in (port.valid.eq(load.valid),
                                                                              port.payload.eq(load.payload))]
        m.d.comb += [eas.k_load.valid.eq(loads["k"].valid), eas.k_load.payload.eq(loads["k"].payload),
                     eas.q_load.valid.eq(Cat(*(load.valid for load in q_loads)).any()),
                     eas.q_load.payload.beat.eq(beat), eas.q_load.payload.data.eq(self.step_in.payload.q)]
        if g > 1:
            m.d.comb += eas.q_load.payload.head.eq(head)
        q_buf = [beat_copy(m, cfg, load, f"{head_name('q', h)}_copy", L, 1)[0] for h, load in enumerate(q_loads)]
        k_buf, v_buf = (beat_copy(m, cfg, loads[name], f"{name}_copy", L, 1)[0] for name in "kv")
        m.d.comb += [buf.addr.eq(beat) for buf in (*q_buf, k_buf, v_buf)]
        m.d.comb += [x for name, load in loads.items()   # (the payload whatever the state: only valid is LOAD's)
                     for x in (load.payload.beat.eq(beat), load.payload.data.eq(self.step_in.payload[name[0]]))]
        m_ref = [Signal(signed(xw), name=head_name("m_ref", h)) for h in range(g)]
        m.d.comb += [d.m.eq(mr) for d, mr in zip(md, m_ref)]

        exact_pass = self._kv_port(m, eas, apid, md, exact)
        s = self._step_registers(m, _Step(ac, eas, md, apid, sfm, exact, ac_cmd, sfm_i, md_corr, corr_to_ac, loads,
                                          beat, head, q_buf, k_buf, v_buf, m_ref, exact_pass))
        with m.FSM():
            self._approx_states(m, s)
            self._finish_states(m, s)
            self._exact_states(m, s)
        with m.If(corr_to_ac):   # (after the FSM: no state drives AC's commands while it is set)
            for corr, cmd in zip(md_corr, ac_cmd):
                wiring.connect(m, corr.o, cmd)
        return m

    def _kv_port(self, m, eas, apid, md, exact):
        """The streams between EAS, APID and MD, and the KV port: MD's (a group's MDs' through a
        KvUnion) or, past max_positions, the exact pass's (while the returned flag is set)."""
        cfg, g = self.cfg, self.cfg.group
        wiring.connect(m, apid.lookup, eas.lookup)
        wiring.connect(m, eas.approx, apid.approx)
        if g == 1:
            wiring.connect(m, apid.cand, md[0].cand)
            wiring.connect(m, md[0].verdict, apid.verdict)
            port = md[0]
        else:
            for h, d in enumerate(md):
                wiring.connect(m, apid.cand[h], d.cand)
                wiring.connect(m, d.verdict, apid.verdict[h])
            m.submodules.kv_union = port = KvUnion(md[0].kv_req.payload.shape(), beat_layout(cfg), g,
                                                   cfg.md_inflight * cfg.beats)
            for h, d in enumerate(md):
                wiring.connect(m, d.kv_req, port.req[h])
                wiring.connect(m, port.resp[h], d.kv_resp)
        # the KV port: MD's (candidates) or, past max_positions, the exact pass's
        exact_pass = Signal()
        with m.If(exact_pass):
            if exact is not None:
                m.d.comb += [self.kv_req.valid.eq(exact.kv_req.valid), self.kv_req.payload.eq(exact.kv_req.payload),
                             exact.kv_req.ready.eq(self.kv_req.ready), exact.kv_resp.valid.eq(self.kv_resp.valid),
                             exact.kv_resp.payload.eq(self.kv_resp.payload), self.kv_resp.ready.eq(exact.kv_resp.ready)]
        with m.Else():
            req = port.kv_req.payload
            m.d.comb += [self.kv_req.valid.eq(port.kv_req.valid), self.kv_req.payload.value.eq(req.value),
                         self.kv_req.payload.position.eq(req.position), self.kv_req.payload.beat.eq(req.beat),
                         port.kv_req.ready.eq(self.kv_req.ready), port.kv_resp.valid.eq(self.kv_resp.valid),
                         port.kv_resp.payload.eq(self.kv_resp.payload), self.kv_resp.ready.eq(port.kv_resp.ready)]
        return exact_pass

    def _step_registers(self, m, s):
        """The step's registers and counters (position, key, the new position's PWL values,
        statistics, KV beats, cycles), the QA offer and AC's command operands: ``s`` with them."""
        cfg, g = self.cfg, self.cfg.group
        sfm_cfg = cfg.sfm
        md, apid, ac_cmd = s.md, s.apid, s.ac_cmd
        n = Signal(cfg.step_position_width)
        key = Signal(s.eas.key_out.payload.shape())
        p_new = [Signal(sfm_cfg.value_width, name=f"p_new{h}") for h in range(g)]
        r_new = [Signal(sfm_cfg.interval_width, name=f"r_new{h}") for h in range(g)]
        candidates = [Signal(cfg.position_width, name=f"candidates{h}") for h in range(g)]
        snap = [[Signal(32, name=f"snap_{name}{h}") for name in ("active", "false_alarms", "mode_changes")]
                for h in range(g)]
        counts = [[d.active, d.false_alarms, d.mode_changes] for d in md]
        kv_beats, cycles = Signal(32), Signal(32)
        absorb_sent = Signal()
        slopes = Array(Const(v, signed(coef_width(cfg))) for v in sfm_cfg.exp_slopes_raw)
        intercepts = Array(Const(v, signed(coef_width(cfg))) for v in sfm_cfg.exp_intercepts_raw)

        with m.If(self.kv_req.valid & self.kv_req.ready):
            m.d.sync += kv_beats.eq(kv_beats + 1)
        # cycles: the step's period, from the previous step's last o beat to this step's, less the
        # cycles spent waiting for step_in or for out to be taken (the absorption is the next step's)
        step_done, env_wait = Signal(), Signal()
        with m.If(step_done):
            m.d.sync += cycles.eq(0)
        with m.Elif(~env_wait):
            m.d.sync += cycles.eq(cycles + 1)
        m.d.comb += env_wait.eq(self.out.valid & ~self.out.ready)
        cmd = [c.payload for c in ac_cmd]
        # the q.A pass goes to each AC as soon as q is loaded; it overlaps EAS and APID pass A (TERMS
        # would otherwise run it)
        # (qa_sent is set from the states that offer QA, not from the muxed command's op: in
        # CLASSIFY_WAIT / MD_DRAIN that op is MD's correction, and the compare reached through the
        # mux into MD's FIFO, then across the die to AC's slice: the critical path without the flag)
        qa_sent, qa_offered = Signal(g), Signal()
        send_qa = [qa_offered.eq(1)]
        for h, (c, p) in enumerate(zip(ac_cmd, cmd)):
            send_qa += [c.valid.eq(~qa_sent[h]), p.op.eq(AcOp.QA)]
            with m.If(qa_offered & ~qa_sent[h] & c.ready):
                m.d.sync += qa_sent[h].eq(1)
        # the heads' AC commands of a state that sends one to every AC: each offered until taken
        sent = Signal(g)

        # AC's command operands whatever the state (AC reads each only with the op and flags that use
        # it); the states choose only valid, op, accumulate and update. Through the states' mux, the
        # decoded state reached the FIFO slice's storage across the die (tile 98.41 MHz, seed 2:
        # state -> beta -> k -> the FIFO's LUT RAM)
        for h, p in enumerate(cmd):
            m.d.comb += [p.m.eq(s.m_ref[h]), p.w.eq(p_new[h]), p.alpha.eq(slopes[r_new[h]]),
                         p.beta.eq(intercepts[r_new[h]]), p.k.eq(s.k_buf.data), p.v.eq(s.v_buf.data)]

        absorb_payload = [apid.absorb.payload.position.eq(n), apid.absorb.payload.center.eq(key.center),
                          apid.absorb.payload.rho.eq(key.rho), apid.absorb.payload.mode.eq(Cat(*r_new))]
        return s._replace(n=n, key=key, p_new=p_new, r_new=r_new, candidates=candidates, snap=snap, counts=counts,
                          kv_beats=kv_beats, cycles=cycles, absorb_sent=absorb_sent, step_done=step_done,
                          env_wait=env_wait, cmd=cmd, sent=sent, qa_sent=qa_sent, send_qa=send_qa,
                          absorb_payload=absorb_payload)

    def _to_every_ac(self, m, s, op, **flags):
        """AC command ``op`` (with ``flags``: accumulate, update) offered to each head's AC until each
        has taken it; returns the signal that all have (in this cycle or before)."""
        took = Cat(*(c.valid & c.ready for c in s.ac_cmd))
        for h, (c, p) in enumerate(zip(s.ac_cmd, s.cmd)):
            m.d.comb += [c.valid.eq(~s.sent[h]), p.op.eq(op), *(getattr(p, f).eq(v) for f, v in flags.items())]
        every = (s.sent | took).all()
        with m.If(every):
            m.d.sync += s.sent.eq(0)
        with m.Else():
            m.d.sync += s.sent.eq(s.sent | took)
        return every

    def _approx_states(self, m, s):
        """The sequencer's states up to the candidates: LOAD, EAS, APID pass A, TERMS, APID pass B
        with MD's corrections into AC."""
        cfg, g = self.cfg, self.cfg.group
        nb = cfg.beats
        eas, md, apid, sfm, sfm_i = s.eas, s.md, s.apid, s.sfm, s.sfm_i
        beat, head, n, m_ref, send_qa = s.beat, s.head, s.n, s.m_ref, s.send_qa
        with m.State("LOAD"):
            m.d.comb += [self.step_in.ready.eq(1), s.env_wait.eq(~self.step_in.valid)]
            m.d.comb += [load.valid.eq(self.step_in.valid & (head == h)) for h, load in
                         enumerate(s.loads[name] for name in s.loads if name not in "kv")]
            m.d.comb += [s.loads[name].valid.eq(self.step_in.valid & (head == 0)) for name in "kv"]
            with m.If(self.step_in.valid):
                m.d.sync += beat.eq(incr(beat, nb))
                with m.If(beat == nb - 1):
                    m.d.sync += head.eq(incr(head, g))
                with m.If((beat == nb - 1) & (head == g - 1)):
                    m.d.sync += [s.kv_beats.eq(0), s.absorb_sent.eq(0), s.qa_sent.eq(0)]
                    m.d.sync += [x.eq(c) for xs, cs in zip(s.snap, s.counts) for x, c in zip(xs, cs)]
                    with m.If(n >= cfg.kv_positions):
                        m.next = "BEYOND"
                    if s.exact is not None:
                        with m.Elif(n >= cfg.max_positions):
                            m.next = "EXACT_QUERY"
                    with m.Else():
                        m.next = "EAS"
        with m.State("EAS"):
            m.d.comb += send_qa
            m.d.comb += eas.start.valid.eq(1)
            with m.If(eas.start.ready):
                m.next = "EAS_WAIT"
        with m.State("EAS_WAIT"):
            m.d.comb += send_qa
            m.d.comb += [sfm_i.valid.eq(eas.recip_req.valid), sfm_i.payload.op.eq(SfmOp.RECIP),
                         sfm_i.payload.z.eq(eas.recip_req.payload), eas.recip_req.ready.eq(sfm_i.ready),
                         eas.recip_resp.valid.eq(sfm.o.valid),
                         eas.recip_resp.payload.mantissa.eq(sfm.o.payload.value),
                         eas.recip_resp.payload.exponent.eq(sfm.o.payload.exponent),
                         eas.key_out.ready.eq(1)]
            with m.If(eas.key_out.valid):
                m.d.sync += [s.key.eq(eas.key_out.payload),
                             *(mr.eq(sn) for mr, sn in zip(m_ref, head_values(cfg, eas.key_out.payload.s_new)))]
                with m.If(n == 0):
                    m.next = "TERMS"
                with m.Else():
                    m.next = "APPROX"
        with m.State("APPROX"):
            m.d.comb += send_qa
            m.d.comb += [apid.scan.valid.eq(1), apid.scan.payload.length.eq(n), apid.scan.payload.classify.eq(0)]
            with m.If(apid.scan.ready):
                m.next = "APPROX_WAIT"
        with m.State("APPROX_WAIT"):
            m.d.comb += send_qa
            m.d.comb += apid.smax.ready.eq(1)
            with m.If(apid.smax.valid):
                for mr, smax in zip(m_ref, head_values(cfg, apid.smax.payload)):
                    with m.If(smax > mr):
                        m.d.sync += mr.eq(smax)
                m.next = "TERMS"
        with m.State("TERMS"):
            with m.If(self._to_every_ac(m, s, AcOp.TERMS)):
                m.d.sync += [c.eq(0) for c in s.candidates]
                with m.If(n == 0):
                    m.next = "NEW_EXP"
                with m.Else():
                    m.next = "CLASSIFY"
        with m.State("CLASSIFY"):
            m.d.comb += [apid.scan.valid.eq(1), apid.scan.payload.length.eq(n),
                         apid.scan.payload.m.eq(Cat(*m_ref)), apid.scan.payload.classify.eq(1)]
            with m.If(apid.scan.ready):
                m.d.sync += s.corr_to_ac.eq(1)
                m.next = "CLASSIFY_WAIT"
        with m.State("CLASSIFY_WAIT"):   # candidates flow APID -> MD -> AC (corr_to_ac)
            m.d.comb += apid.done.ready.eq(1)
            with m.If(apid.done.valid):
                m.d.sync += [c.eq(x) for c, x in zip(s.candidates, head_values(cfg, apid.done.payload))]
                m.next = "MD_DRAIN"
        with m.State("MD_DRAIN"):   # until every MD and its corrections' slice are empty
            with m.If(~Cat(*(d.busy | corr.o.valid for d, corr in zip(md, s.md_corr))).any()):
                m.d.sync += s.corr_to_ac.eq(0)
                m.next = "NEW_EXP"

    def _finish_states(self, m, s):
        """The sequencer's states from the new position on: its PWL value (per head, on the one SFM in
        turn) into N and Z, AC's FINISH with the step's statistics on ``out`` (head by head), the
        absorption of position n."""
        cfg, g = self.cfg, self.cfg.group
        nb, xw = cfg.beats, cfg.sfm.x_width
        ac, eas, apid, sfm, sfm_i = s.ac, s.eas, s.apid, s.sfm, s.sfm_i
        beat, head, n, key, m_ref, absorb_sent = s.beat, s.head, s.n, s.key, s.m_ref, s.absorb_sent
        s_new = head_values(cfg, key.s_new)
        with m.State("NEW_EXP"):   # head h's new position: (p_n, r_n) = EXP(sat(s_n - m))
            x_new = Array(saturate(sn - mr, signed(xw)) for sn, mr in zip(s_new, m_ref))[head]
            m.d.comb += [sfm_i.valid.eq(1), sfm_i.payload.op.eq(SfmOp.EXP), sfm_i.payload.x.eq(x_new)]
            with m.If(sfm_i.ready):
                m.next = "NEW_EXP_WAIT"
        with m.State("NEW_EXP_WAIT"):
            with m.If(sfm.o.valid):
                m.d.sync += [Array(s.p_new)[head].eq(sfm.o.payload.value), Array(s.r_new)[head].eq(sfm.o.payload.interval),
                             beat.eq(0), head.eq(incr(head, g))]
                with m.If(head == g - 1):
                    m.next = "NEW_BEATS"
                with m.Else():
                    m.next = "NEW_EXP"
        with m.State("NEW_BEATS"):
            with m.If(self._to_every_ac(m, s, AcOp.BEATS, accumulate=1, update=0)):
                m.d.sync += beat.eq(incr(beat, nb))
                with m.If(beat == nb - 1):
                    m.next = "FINISH"
        with m.State("FINISH"):
            with m.If(self._to_every_ac(m, s, AcOp.FINISH)):
                m.next = "FINISH_WAIT"
        with m.State("FINISH_WAIT"):   # head by head (``head``): its RECIP on the SFM, its o beats
            recip_req = Array(a.recip_req for a in ac)[head] if g > 1 else ac[0].recip_req
            m.d.comb += [sfm_i.valid.eq(recip_req.valid), sfm_i.payload.op.eq(SfmOp.RECIP),
                         sfm_i.payload.z.eq(recip_req.payload)]
            for h, a in enumerate(ac):
                here = head == h
                m.d.comb += [a.recip_req.ready.eq(here & sfm_i.ready), a.recip_resp.valid.eq(here & sfm.o.valid),
                             a.recip_resp.payload.mantissa.eq(sfm.o.payload.value),
                             a.recip_resp.payload.exponent.eq(sfm.o.payload.exponent),
                             a.out.ready.eq(here & self.out.ready)]
            # o beats with the head's statistics
            pick = (lambda xs: xs[0]) if g == 1 else (lambda xs: Array(xs)[head])   # noqa: E731
            m.d.comb += [self.out.valid.eq(pick([a.out.valid for a in ac])),
                         self.out.payload.o.eq(pick([a.out.payload.as_value() for a in ac])),
                         self.out.payload.position.eq(n), self.out.payload.centers.eq(eas.centers),
                         self.out.payload.new_center.eq(key.new_center), self.out.payload.m.eq(pick(m_ref)),
                         self.out.payload.z.eq(pick([a.z for a in ac])), self.out.payload.kv_beats.eq(s.kv_beats),
                         self.out.payload.cycles.eq(s.cycles), self.out.payload.path.eq(StepPath.LAD),
                         self.out.payload.candidates.eq(pick(s.candidates))]
            if g > 1:
                m.d.comb += self.out.payload.head.eq(head)
            for i, field in enumerate(("active", "false_alarms", "mode_changes")):
                m.d.comb += self.out.payload[field].eq(pick([c[i] - sn[i] for c, sn in zip(s.counts, s.snap)]))
            with m.If(self.out.valid & self.out.ready):
                m.d.sync += beat.eq(incr(beat, nb))
                with m.If(beat == nb - 1):
                    m.d.sync += head.eq(incr(head, g))
                    with m.If(head == g - 1):
                        m.d.comb += s.step_done.eq(1)
                        m.next = "ABSORB"
        with m.State("ABSORB"):   # position n joins the caches with its interval as mode
            every = self._to_every_ac(m, s, AcOp.BEATS, accumulate=0, update=1)
            m.d.comb += [apid.absorb.valid.eq(~absorb_sent), *s.absorb_payload]
            with m.If(apid.absorb.valid & apid.absorb.ready):
                m.d.sync += absorb_sent.eq(1)
            with m.If(every):
                m.d.sync += beat.eq(incr(beat, nb))
            with m.If((beat == nb - 1) & every & (absorb_sent | apid.absorb.ready)):
                m.d.sync += n.eq(n + 1)
                m.next = "LOAD"
            with m.If((beat == nb - 1) & every & ~(absorb_sent | apid.absorb.ready)):
                m.d.sync += beat.eq(beat)   # hold the last beat until APID took the metadata
                m.next = "ABSORB_META"
        with m.State("ABSORB_META"):
            m.d.comb += [apid.absorb.valid.eq(~absorb_sent), *s.absorb_payload]
            with m.If(absorb_sent | apid.absorb.ready):
                m.d.sync += [n.eq(n + 1), beat.eq(0)]
                m.next = "LOAD"

    def _exact_states(self, m, s):
        """The sequencer's states past max_positions: the exact pass (where there is one; a group's
        queries head by head), and BEYOND past kv_positions (``group`` x ``beats`` beats of o = 0)."""
        g, nb = self.cfg.group, self.cfg.beats
        exact, eas, beat, head, n = s.exact, s.eas, s.beat, s.head, s.n
        if exact is not None:
            with m.State("EXACT_QUERY"):   # past max_positions: the queries to the exact pass
                q = s.q_buf[0].data if g == 1 else Array(b.data for b in s.q_buf)[head]
                m.d.comb += [exact.query.valid.eq(1), exact.query.payload.q.eq(q),
                             exact.query.payload.length.eq(n + 1)]
                with m.If(exact.query.ready):
                    m.d.sync += beat.eq(incr(beat, nb))
                    with m.If(beat == nb - 1):
                        m.d.sync += head.eq(incr(head, g))
                        with m.If(head == g - 1):
                            m.next = "EXACT"
            with m.State("EXACT"):         # it owns the KV port; its o beats leave with its statistics
                d = exact.out.payload
                m.d.comb += [s.exact_pass.eq(1), self.out.valid.eq(exact.out.valid), exact.out.ready.eq(self.out.ready),
                             self.out.payload.o.eq(d.o), self.out.payload.position.eq(n),
                             self.out.payload.path.eq(StepPath.EXACT), self.out.payload.centers.eq(eas.centers),
                             self.out.payload.m.eq(d.m), self.out.payload.z.eq(d.z),
                             self.out.payload.kv_beats.eq(d.kv_beats), self.out.payload.cycles.eq(d.cycles)]
                if g > 1:
                    m.d.comb += self.out.payload.head.eq(d.head)
                with m.If(self.out.valid & self.out.ready):
                    m.d.sync += beat.eq(incr(beat, nb))
                    with m.If(beat == nb - 1):
                        m.d.sync += head.eq(incr(head, g))
                        with m.If(head == g - 1):
                            m.d.sync += n.eq(n + 1)
                            m.d.comb += s.step_done.eq(1)
                            m.next = "LOAD"
        with m.State("BEYOND"):        # past kv_positions: no output, nothing changes
            m.d.comb += [self.out.valid.eq(1), self.out.payload.position.eq(n),
                         self.out.payload.path.eq(StepPath.BEYOND), self.out.payload.centers.eq(eas.centers)]
            if g > 1:
                m.d.comb += self.out.payload.head.eq(head)
            with m.If(self.out.ready):
                m.d.sync += beat.eq(incr(beat, nb))
                with m.If(beat == nb - 1):
                    m.d.sync += head.eq(incr(head, g))
                    with m.If(head == g - 1):
                        m.d.comb += s.step_done.eq(1)
                        m.next = "LOAD"
