"""cocotb: LAD AC (hdl/lad/ac.py) alone == golden.lad_tile.LadTileModel's AC (docs/algorithms.md §1.2 cache
terms N = qA/sqrt(d) - mB + C, Z = qD/sqrt(d) - mE + F; §1.3 corrections N += w v, Z += w;
§1.4 mode-change and §1.5 absorption cache updates; o = N RECIP(Z)), bit-exact.

The bench plays the tile sequencer, MD and the SFM from the golden trace: per step it sets q and
sends ``cmd`` TERMS(m) (checks ``z`` = Z from the caches, and with ``probe`` a FINISH whose ``o``
must equal ``LadTileModel.finish`` of the cache terms: the caches seen directly), the MD
corrections of the step's actives (BEATS with w, alpha, beta, update = mode change, k_i, v_i),
the new position (w = p_n, v_n), checks ``z``, then FINISH: ``recip_req`` = clamp(Z), served with
golden.sfm.recip (random latency), every ``out`` beat = golden o; then the absorption BEATS
(update only). Fields a command does not use carry random values. Random gaps on
cmd/recip_resp, back-pressure on out/recip_req.
"""
from __future__ import annotations

import cocotb
import torch
from amaranth import unsigned
from cocotb.triggers import ClockCycles

from golden.lad_tile import LadTileConfig
from golden.sfm import recip
from hdl.lad.common import AC_BEATS, AC_FINISH, AC_TERMS, W_WIDTH, ac_command_layout, beat_layout, vector_layout
from hdl.lad.eas import recip_resp_layout
from testbenches.streams import StreamMemory, StreamSink, StreamSource, pack, wait_until
from testbenches.tb.lad_steps import beats, open_bench


def command(cfg: LadTileConfig, rng, **fields) -> dict:
    """An AC command: ``fields`` set, every other field random (the command must ignore it)."""
    def rand_signed(bits):
        return rng.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    cw, kw = cfg.sfm.coef_frac + 2, cfg.kv_width
    cmd = {"op": AC_BEATS, "m": rand_signed(cfg.sfm.x_width), "w": rand_signed(W_WIDTH), "alpha": rand_signed(cw),
           "beta": rand_signed(cw), "accumulate": 0, "update": 0,
           "k": [rand_signed(kw) for _ in range(cfg.lanes)], "v": [rand_signed(kw) for _ in range(cfg.lanes)]}
    cmd.update(fields)
    return cmd


@cocotb.test()
async def ac_matches_golden(dut):
    ctx, (q, k, v), model, recs, cycles, (gap, stall) = await open_bench(dut)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params

    def sfm_recip(z):
        m_, e_ = (int(t) for t in recip(torch.tensor([z]), cfg.sfm))
        return {"mantissa": m_, "exponent": e_}

    cmd_src = StreamSource(dut, "cmd", ac_command_layout(cfg), cycles, rng, gap=gap)
    out_sink = StreamSink(dut, "out", beat_layout(cfg), cycles, rng, stall=stall)
    sfm = StreamMemory(dut, "recip_req", unsigned(cfg.sfm.recip_in_width), "recip_resp", recip_resp_layout(cfg),
                       cycles, rng, sfm_recip, latency=tuple(p.get("latency", (1, 8))), stall=stall, gap=gap)
    budget = 40 * cfg.head_dim * cfg.beats + 4000
    mismatches, want_out, want_recip = [], [], []
    probes = updates = 0

    async def settle():
        await wait_until(cycles, lambda: cmd_src.idle, budget, "commands taken")
        await wait_until(cycles, lambda: not int(dut.busy.value), budget, "AC idle")

    async def finish(o, z_in, what):
        want_recip.append(z_in)
        want_out.extend((what, b) for b in beats(o, cfg))
        cmd_src.put(command(cfg, rng, op=AC_FINISH))
        await out_sink.wait_for(len(want_out), timeout_cycles=budget)

    for rec in recs:
        n = rec["n"]
        dut.q.value = pack(vector_layout(cfg), rec["q"])
        cmd_src.put(command(cfg, rng, op=AC_TERMS, m=rec["m"]))
        await settle()
        if dut.z.value.to_signed() != rec["terms_z"]:
            mismatches.append(f"step {n} z after TERMS: rtl {dut.z.value.to_signed()} golden {rec['terms_z']}")
        if rng.random() < p.get("probe", 0.5):   # o of the cache terms alone
            probes += 1
            o, z_in = model.finish(rec["terms_n"], rec["terms_z"])
            await finish(o.tolist(), z_in, f"step {n} probe")
        md = rec["md"]
        for j, pos in enumerate(rec["cand"]):
            if not md["active"][j]:
                continue
            updates += int(md["change"][j])
            for kb, vb in zip(beats(k[pos].tolist(), cfg), beats(v[pos].tolist(), cfg)):
                cmd_src.put(command(cfg, rng, w=md["w"][j], alpha=md["alpha"][j], beta=md["beta"][j], accumulate=1,
                                    update=int(md["change"][j]), k=kb, v=vb))
        for vb in beats(rec["v"], cfg):
            cmd_src.put(command(cfg, rng, w=rec["p_new"], accumulate=1, v=vb))
        await settle()
        if dut.z.value.to_signed() != rec["z"]:
            mismatches.append(f"step {n} z: rtl {dut.z.value.to_signed()} golden {rec['z']}")
        await finish(rec["o"], rec["z_in"], f"step {n}")
        for kb, vb in zip(beats(rec["k"], cfg), beats(rec["v"], cfg)):
            cmd_src.put(command(cfg, rng, alpha=rec["absorb_alpha"], beta=rec["absorb_beta"], update=1, k=kb, v=vb))
        await settle()
    await ClockCycles(dut.clk, 50)
    got_out = [o for _, o in out_sink.received]
    mismatches += [f"{what} o: rtl {g} golden {w}" for g, (what, w) in zip(got_out, want_out) if g != w]
    got_recip = [z for _, z in sfm.requests.received]
    if got_recip != want_recip:
        mismatches.append(f"recip_req: rtl {got_recip} golden {want_recip}")
    if len(got_out) != len(want_out):
        mismatches.append(f"out count: rtl {len(got_out)} golden {len(want_out)}")
    zf = cfg.sfm.recip_in_width
    ctx.report.update(
        steps=len(recs), vectors=len(recs), mismatches=len(mismatches), mismatch_list=mismatches[:20],
        beats=len(want_out), probes=probes, corrections=sum(sum(r["md"]["active"]) for r in recs),
        mode_change_updates=updates, absorptions=len(recs),
        nonzero_outputs=sum(1 for _, w in want_out if any(w)),
        saturated_outputs=sum(1 for _, w in want_out if any(abs(x) >= (1 << (cfg.kv_width - 1)) - 1 for x in w)),
        z_clamped=sum(1 for z in want_recip if z in (0, (1 << zf) - 1)), cycles=cycles.now)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
