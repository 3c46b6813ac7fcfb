"""cocotb: LAD AC (hdl/lad/ac.py) alone == golden.lad_tile.LadTileModel's AC (docs/algorithms.md §1.2 cache
terms N = qA/sqrt(d) - mB + C, Z = qD/sqrt(d) - mE + F; §1.3 corrections N += w v, Z += w;
§1.4 mode-change and §1.5 absorption cache updates; o = N RECIP(Z)), bit-exact.

The bench plays the tile sequencer, MD and the SFM from the golden trace: per step it loads q
(``q_load``: random beat order and gaps) and sends ``cmd`` TERMS(m), half the time after a QA (at
once, or once its pass is done; checks ``z`` = Z from the caches, and with ``probe`` a FINISH whose ``o``
must equal ``LadTileModel.finish`` of the cache terms: the caches seen directly), the MD
corrections of the step's actives (BEATS with w, alpha, beta, update = mode change, k_i, v_i),
the new position (w = p_n, v_n), checks ``z``, then FINISH: ``recip_req`` = clamp(Z), served with
golden.sfm.recip (random latency), every ``out`` beat = golden o; then the absorption BEATS
(update only), half the time followed at once by the next step's commands (the A engine still
busy). RECIP's corners, with ``recip_corners`` (probability per step, once N of the cache terms is
not zero): after TERMS, BEATS with v = 0 and w moving Z to a power of two (RECIP's mantissa 1.0, its
top bit), to -1 (clamped to 0: the mantissa's largest value), past its largest value (Z
saturated) and one below it (in range, by one), a FINISH at each (o = ``LadTileModel.finish`` of the cache terms' N), then Z moved
back. Fields a command does not use carry random values. Random gaps on cmd/recip_resp,
back-pressure on out/recip_req. A probe's
FINISH is followed at once by the corrections half the time, a corner's always (``out_stall``: the out
sink's back-pressure, high enough that a FINISH's beats are still leaving when the next FINISH could
start): cmd must not be ready until a FINISH's last beat has left (a monitor counts the cycles it
is; ``busy`` must be high all that time). With ``decoy`` (probability per step), the step's TERMS
comes without a QA right behind a QA and TERMS of another step's q and m (no cache update between):
it must run its own q.A_r pass (a QA serves one TERMS). Reported cycles: TERMS's, from its transfer
until AC is idle, after a QA and without one.
"""
from __future__ import annotations

import cocotb
from amaranth import unsigned
from cocotb.triggers import ReadOnly, RisingEdge

from golden.lad_tile import LadTileConfig
from hdl.lad.common import AcOp, ac_command_layout, beat_layout, beat_load_layout, coef_width, recip_resp_layout, w_width
from testbenches.tb.lad_steps import beats, load_vector, open_bench, sfm_recip


def command(cfg: LadTileConfig, rng, **fields) -> dict:
    """An AC command: ``fields`` set, every other field random (the command must ignore it)."""
    def rand_signed(bits):
        return rng.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    cw, kw = coef_width(cfg), cfg.kv_width
    cmd = {"op": AcOp.BEATS, "m": rand_signed(cfg.sfm.x_width), "w": rand_signed(w_width(cfg)), "alpha": rand_signed(cw),
           "beta": rand_signed(cw), "accumulate": 0, "update": 0,
           "k": [rand_signed(kw) for _ in range(cfg.lanes)], "v": [rand_signed(kw) for _ in range(cfg.lanes)]}
    cmd.update(fields)
    return cmd


@cocotb.test()
async def ac_matches_golden(dut):
    bench, (q, k, v), model, recs = await open_bench(dut)
    cfg, rng = bench.cfg, bench.rng
    q_src = bench.source("q_load", beat_load_layout(cfg))
    cmd_src = bench.source("cmd", ac_command_layout(cfg))
    out_sink = bench.sink("out", beat_layout(cfg), stall=bench.params.get("out_stall"))
    sfm = bench.memory("recip_req", unsigned(cfg.sfm.recip_in_width), "recip_resp", recip_resp_layout(cfg),
                       sfm_recip(cfg))
    budget = 40 * cfg.head_dim * cfg.beats + 4000
    want_recip = []
    probes = updates = qa_passes = recip_corners = 0
    terms_cycles = {True: [], False: []}   # TERMS's cycles after a QA, without one
    # cycles with a FINISH's beats still to leave: cmd ready, cmd offered, busy low
    interlock = {"ready": 0, "offered": 0, "idle": 0}
    decoys = z_saturated = 0
    z_max, w_max = (1 << (cfg.z_width - 1)) - 1, (1 << (w_width(cfg) - 1)) - 1

    async def watch_out_interlock():   # a FINISH holds cmd until its last beat has left (o's FIFO holds one)
        seen_cmd = seen_out = finishes = 0
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            now = bench.cycles.now   # transfers of earlier cycles (this cycle's may be logged already)
            while seen_cmd < len(cmd_src.log) and cmd_src.log[seen_cmd][0] < now:
                finishes += cmd_src.log[seen_cmd][1]["op"] == AcOp.FINISH
                seen_cmd += 1
            while seen_out < len(out_sink.log) and out_sink.log[seen_out][0] < now:
                seen_out += 1
            if finishes * cfg.beats > seen_out:
                interlock["ready"] += int(cmd_src.ready.value)
                interlock["offered"] += int(cmd_src.valid.value)
                interlock["idle"] += not int(dut.busy.value)
    cocotb.start_soon(watch_out_interlock())

    async def settle(extra_beats=0):   # extra_beats: BEATS commands queued beyond a step's
        wait = budget + 8 * extra_beats
        await bench.until(lambda: cmd_src.idle, wait, "commands taken")
        await bench.until(lambda: not int(dut.busy.value), wait, "AC idle")

    async def finish(o, z_in, what, wait=True):   # wait=False: the next commands follow at once
        want_recip.append(z_in)
        for b, ob in enumerate(beats(o, cfg)):
            out_sink.expect(ob, inputs=f"{what} o beat {b}")
        cmd_src.put(command(cfg, rng, op=AcOp.FINISH))
        if wait:
            await out_sink.wait_for(len(out_sink.expected), timeout_cycles=budget)

    for rec in recs:
        n = rec.n
        decoy = rng.random() < bench.params.get("decoy", 0)
        if decoy:   # a QA and TERMS of another q first: this step's TERMS must not take that q.A_r
            other = rng.choice([r for r in recs if r.q != rec.q])
            decoys += 1
            await load_vector(bench, q_src, other.q)
            cmd_src.put(command(cfg, rng, op=AcOp.QA), command(cfg, rng, op=AcOp.TERMS, m=other.m))
            await settle()
        await load_vector(bench, q_src, rec.q)
        qa = not decoy and rng.random() < 0.5
        if qa:   # the q.A pass ahead of TERMS, as the tile sends it
            qa_passes += 1
            cmd_src.put(command(cfg, rng, op=AcOp.QA))
            if rng.random() < 0.5:   # TERMS later, once the pass is done (in the tile: m comes after EAS, APID)
                await settle()
        cmd_src.put(command(cfg, rng, op=AcOp.TERMS, m=rec.m))
        await settle()
        terms_cycles[qa].append(bench.cycles.now - cmd_src.log[-1][0])   # from TERMS's transfer to idle
        bench.check(f"step {n} z after TERMS", dut.z.value.to_signed(), rec.terms_z)
        if rng.random() < bench.params.get("probe", 0.5):   # o of the cache terms alone
            probes += 1
            o, z_in = model.finish(rec.terms_n, rec.terms_z)
            await finish(o, z_in, f"step {n} probe", wait=rng.random() < 0.5)
        corners = bench.params.get("recip_corners", 0)
        if corners and any(rec.terms_n) and 0 < rec.terms_z and rng.random() < corners:
            recip_corners += 1   # Z at a power of two, below zero, saturated; N the cache terms'
            z_now, moved = rec.terms_z, 0
            for target, aim in ((1 << (rec.terms_z.bit_length() - 1),) * 2, (-1, -1), (z_max, z_max + w_max),
                                (z_max - 1,) * 2, (rec.terms_z,) * 2):
                while z_now != target:   # positions of w within its range, the last aiming past a saturated Z
                    w = max(-w_max - 1, min(w_max, aim - z_now))
                    for kb in beats([0] * cfg.head_dim, cfg):   # w counts once per nb beats, v = 0 keeps N
                        cmd_src.put(command(cfg, rng, w=w, accumulate=1, v=kb))
                    moved += cfg.beats
                    z_saturated += z_now + w > z_max
                    z_now = min(z_now + w, z_max)
                await settle(moved)
                bench.check(f"step {n} z moved to {target}", dut.z.value.to_signed(), target)
                if target != rec.terms_z:
                    o, z_in = model.finish(rec.terms_n, target)
                    await finish(o, z_in, f"step {n} Z = {target}", wait=False)
        for pos, g in zip(rec.cand, rec.md):
            if not g.active:
                continue
            updates += int(g.change)
            for kb, vb in zip(beats(k[pos], cfg), beats(v[pos], cfg)):
                cmd_src.put(command(cfg, rng, w=g.w, alpha=g.alpha, beta=g.beta, accumulate=1, update=int(g.change),
                                    k=kb, v=vb))
        for vb in beats(rec.v, cfg):
            cmd_src.put(command(cfg, rng, w=rec.p_new, accumulate=1, v=vb))
        await settle()
        bench.check(f"step {n} z", dut.z.value.to_signed(), rec.z)
        await finish(rec.o, rec.z_in, f"step {n}")
        for kb, vb in zip(beats(rec.k, cfg), beats(rec.v, cfg)):
            cmd_src.put(command(cfg, rng, alpha=rec.absorb_alpha, beta=rec.absorb_beta, update=1, k=kb, v=vb))
        if rng.random() < 0.5:   # else the next step's QA/TERMS follow while the A engine still runs
            await settle()
    await bench.drain(timeout_cycles=budget, settle=50)
    bench.compare("recip_req", sfm.requests.items, want_recip)
    want_out = [o for o, _ in out_sink.expected]
    zf = cfg.sfm.recip_in_width
    bench.finish(
        vectors=len(recs), steps=len(recs), beats=len(want_out), probes=probes, qa_passes=qa_passes,
        recip_corners=recip_corners, cmd_ready_while_out_pending=interlock["ready"],
        cmd_offered_while_out_pending=interlock["offered"], idle_while_out_pending=interlock["idle"], decoys=decoys,
        z_saturated=z_saturated,
        terms_cycles_after_qa=terms_cycles[True], terms_cycles_alone=terms_cycles[False],
        corrections=sum(sum(g.active for g in r.md) for r in recs), mode_change_updates=updates,
        absorptions=len(recs), nonzero_outputs=sum(1 for w in want_out if any(w)),
        saturated_outputs=sum(1 for w in want_out if any(abs(x) >= (1 << (cfg.kv_width - 1)) - 1 for x in w)),
        z_clamped=sum(1 for z in want_recip if z in (0, (1 << zf) - 1)))
