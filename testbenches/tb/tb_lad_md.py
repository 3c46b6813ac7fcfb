"""cocotb: LAD MD (hdl/lad/md.py) alone == golden.lad_tile.LadTileModel.md_decide (docs/algorithms.md
§1.3-1.4: exact x_i = s_i - m, interval r_i, false alarm / active, counter of r_i bumped with
halving, mode change, alpha_i, beta_i, w_i = alpha_i x_i + beta_i), bit-exact.

The bench plays the tile sequencer, APID, the KV memory and AC: per step it sets q and m, sends
the golden trace's candidates (position, mode, counters) plus random extra candidates (random
mode, counters at or near saturation), serves ``kv_req`` from the step sequence's K/V
(random latency), and checks every ``verdict`` (mode, counters), every KV request (k_i beats
of each candidate, v_i beats of actives), every ``corr`` AC command (w, alpha, beta, update =
mode change, k_i and v_i beats) and the active / false-alarm / mode-change counters. Extra
corner steps use m at the x format's extremes (x saturates both ways). Random gaps on
cand/kv_resp, back-pressure on verdict/kv_req/corr.
"""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.lad_tile import LadTileConfig
from hdl.lad.common import AC_BEATS, ac_command_layout, beat_layout, candidate_layout, vector_layout
from hdl.lad.dense import kv_request_layout
from testbenches.streams import StreamMemory, StreamSink, StreamSource, pack, wait_until
from testbenches.tb.lad_steps import beats, open_bench


def random_candidates(cfg: LadTileConfig, rng, count: int, positions: int) -> list[tuple[int, int, list[int]]]:
    """Random (position, mode, counters); half of them with a counter at counter_max."""
    out = []
    for _ in range(count):
        counters = [rng.randint(0, cfg.counter_max) for _ in range(cfg.n_intervals)]
        if rng.random() < 0.5:
            counters[rng.randrange(cfg.n_intervals)] = cfg.counter_max
        out.append((rng.randrange(positions), rng.randrange(cfg.n_intervals), counters))
    return out


@cocotb.test()
async def md_matches_golden(dut):
    ctx, (q, k, v), model, recs, cycles, (gap, stall) = await open_bench(dut)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    xf, nb, L = cfg.sfm.x_format, cfg.beats, cfg.lanes
    steps = q.shape[0]

    def kv_lookup(req):
        table = v if req["value"] else k
        return table[req["position"], req["beat"] * L:(req["beat"] + 1) * L].tolist()

    cand_src = StreamSource(dut, "cand", candidate_layout(cfg), cycles, rng, gap=gap)
    verdict_sink = StreamSink(dut, "verdict", candidate_layout(cfg), cycles, rng, stall=stall)
    memory = StreamMemory(dut, "kv_req", kv_request_layout(cfg), "kv_resp", beat_layout(cfg), cycles, rng,
                          kv_lookup, latency=tuple(p.get("latency", (1, 8))), stall=stall, gap=gap)
    corr_sink = StreamSink(dut, "corr", ac_command_layout(cfg), cycles, rng, stall=stall)

    # the trace's steps (candidates of the tile + extras), then corner steps with extreme m
    plan = []
    extra = p.get("extra_candidates", 2)
    for rec in recs:
        cands = list(zip(rec["cand"], rec["cand_mode"], rec["cand_counters"]))
        plan.append((rec["q"], rec["m"], cands + random_candidates(cfg, rng, extra if rec["n"] else 0, rec["n"] or 1)))
    for m in (xf.max_raw, xf.min_raw, 0, xf.min_raw + 1, xf.max_raw - 1)[:p.get("corner_steps", 5)]:
        plan.append((q[rng.randrange(steps)].tolist(), m, random_candidates(cfg, rng, 6, steps)))

    mismatches = []
    want_verdicts, want_kv, want_corr = [], [], []
    totals = {"active": 0, "false_alarms": 0, "mode_changes": 0}
    halvings, x_saturated, intervals_seen = 0, 0, set()
    for step, (qv, m, cands) in enumerate(plan):
        dut.q.value = pack(vector_layout(cfg), qv)
        dut.m.value = m & ((1 << xf.width) - 1)
        if not cands:
            continue
        pos = torch.tensor([c[0] for c in cands], dtype=torch.int64)
        mode = torch.tensor([c[1] for c in cands], dtype=torch.int64)
        counters = torch.tensor([c[2] for c in cands], dtype=torch.int64)
        g = {key: t.tolist() for key, t in model.md_decide(torch.tensor(qv), m, k[pos], mode, counters).items()}
        for j, (pj, mj, cj) in enumerate(cands):
            cand_src.put({"position": pj, "mode": mj, "counters": cj})
            want_verdicts.append({"position": pj, "mode": g["mode"][j], "counters": g["counters"][j]})
            want_kv += [{"value": 0, "position": pj, "beat": b} for b in range(nb)]
            halvings += int(cj[g["r"][j]] + 1 > cfg.counter_max)
            if g["active"][j]:
                want_kv += [{"value": 1, "position": pj, "beat": b} for b in range(nb)]
                for kb, vb in zip(beats(k[pj].tolist(), cfg), beats(v[pj].tolist(), cfg)):
                    want_corr.append({"op": AC_BEATS, "w": g["w"][j], "alpha": g["alpha"][j], "beta": g["beta"][j],
                                      "accumulate": 1, "update": int(g["change"][j]), "k": kb, "v": vb})
        intervals_seen.update(g["r"])
        x_saturated += sum(1 for x in g["x"] if x in (xf.min_raw, xf.max_raw))
        totals["active"] += sum(g["active"])
        totals["false_alarms"] += len(cands) - sum(g["active"])
        totals["mode_changes"] += sum(g["change"])
        budget = len(cands) * 40 * nb + 2000
        await verdict_sink.wait_for(len(want_verdicts), timeout_cycles=budget)
        await corr_sink.wait_for(len(want_corr), timeout_cycles=budget)
        await wait_until(cycles, lambda: cand_src.idle and not int(dut.busy.value), budget, "MD idle")
        got = {key: int(getattr(dut, key).value) for key in totals}
        if got != totals:
            mismatches.append(f"step {step} counters: rtl {got} golden {totals}")
    await ClockCycles(dut.clk, 50)
    got_verdicts = [x for _, x in verdict_sink.received]
    got_kv = [x for _, x in memory.requests.received]
    got_corr = [{key: x[key] for key in ("op", "w", "alpha", "beta", "accumulate", "update", "k", "v")}
                for _, x in corr_sink.received]
    for what, got, want in (("verdict", got_verdicts, want_verdicts), ("kv_req", got_kv, want_kv),
                            ("corr", got_corr, want_corr)):
        mismatches += [f"{what} #{j}: rtl {a} golden {b}" for j, (a, b) in enumerate(zip(got, want)) if a != b]
        if len(got) != len(want):
            mismatches.append(f"{what} count: rtl {len(got)} golden {len(want)}")
    trace_cands = sum(len(r["cand"]) for r in recs)
    ctx.report.update(
        steps=len(plan), vectors=len(want_verdicts), mismatches=len(mismatches), mismatch_list=mismatches[:20],
        candidates=len(want_verdicts), trace_candidates=trace_cands, **totals, halvings=halvings,
        corr=len(want_corr), kv_requests=len(want_kv),
        nonzero_w=sum(1 for c in want_corr if c["w"] != 0),
        intervals_seen=sorted(intervals_seen), x_saturated=x_saturated,
        cycles=cycles.now)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
