"""cocotb: LAD MD (hdl/lad/md.py) alone == golden.lad_tile.LadTileModel.md_decide (docs/algorithms.md
§1.3-1.4: exact x_i = s_i - m, interval r_i, false alarm / active, counter of r_i bumped with
halving, mode change, alpha_i, beta_i, w_i = alpha_i x_i + beta_i), bit-exact.

The bench plays the tile sequencer, APID, the KV memory and AC: per step it loads q (``q_load``: random beat order and gaps) and m, sends
the golden trace's candidates (position, mode, counters) plus random extra candidates (random
mode, counters at or near saturation), serves ``kv_req`` from the step sequence's K/V
(random latency), and checks every ``verdict`` (mode, counters), every KV request (k_i beats
of each candidate, v_i beats of actives), every ``corr`` AC command (w, alpha, beta, update =
mode change, k_i and v_i beats) and the active / false-alarm / mode-change counters. Extra
corner steps use m at the x format's extremes (x saturates both ways); rounding steps choose m so
that an active's weight sum lands one below a rounding carry (``rounding_edge_step``). Random gaps on
cand/kv_resp, back-pressure on verdict/kv_req/corr (``corr_hold``: each corr stall lasts up to that
many cycles, so the corrections' FIFO fills). ``busy`` (which the tile's sequencer waits on) must be
high in every cycle from a candidate's acceptance to its verdict and its last correction.
"""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ReadOnly, RisingEdge

from golden.lad_tile import LadTileConfig
from golden.sfm import exp_pwl
from hdl.lad.common import AcOp, ac_command_layout, beat_layout, beat_load_layout, candidate_layout
from hdl.lad.dense import kv_request_layout
from testbenches.streams import kv_lookup
from testbenches.tb.lad_steps import beats, load_vector, open_bench


def random_candidates(cfg: LadTileConfig, rng, count: int, positions: int) -> list[tuple[int, int, list[int]]]:
    """Random (position, mode, counters); half of them with a counter at counter_max."""
    out = []
    for _ in range(count):
        counters = [rng.randint(0, cfg.counter_max) for _ in range(cfg.n_intervals)]
        if rng.random() < 0.5:
            counters[rng.randrange(cfg.n_intervals)] = cfg.counter_max
        out.append((rng.randrange(positions), rng.randrange(cfg.n_intervals), counters))
    return out


def at_rounding_edge(alpha, x, beta, sfm):
    """Whether MD's weight sum ``alpha x + (beta << x_frac) + half`` ends one below a multiple of
    ``2^exp_shift``: ``w`` one step from rounding up (ints or tensors); never when nothing is rounded."""
    if sfm.exp_shift <= 0:
        return False
    unit = 1 << sfm.exp_shift
    return (alpha * x + (beta << sfm.x_frac) + unit // 2) % unit == unit - 1


def rounding_edge_step(cfg: LadTileConfig, model, qv, k, rng, positions: int):
    """A step of one active candidate at the rounding edge (:func:`at_rounding_edge`): ``m`` is chosen so
    that the candidate's exact ``x`` lands there (random vectors reach such a sum about once in
    ``2^exp_shift`` actives). None when no x of a random sample does (or nothing is rounded)."""
    sfm, xf = cfg.sfm, cfg.sfm.x_format
    if sfm.exp_shift <= 0:
        return None
    pos = rng.randrange(positions)
    score = int(model.score(torch.tensor(qv), k[pos:pos + 1])[0])
    gen = torch.Generator().manual_seed(rng.getrandbits(32))
    lo = max(xf.min_raw, 2 * min(sfm.exp_boundaries_raw, default=0))   # half the x in and near the PWL's intervals
    x = torch.cat([torch.randint(xf.min_raw, xf.max_raw + 1, (1 << 15,), generator=gen),
                   torch.randint(lo, xf.max_raw + 1, (1 << 15,), generator=gen)])
    _, r = exp_pwl(x, sfm)
    m = score - x
    for mode in rng.sample(range(cfg.n_intervals), cfg.n_intervals):   # an odd alpha or beta makes the edge reachable
        edge = at_rounding_edge(model.slopes[r] - model.slopes[mode], x, model.intercepts[r] - model.intercepts[mode], sfm)
        hit = edge & (r != mode) & (m >= xf.min_raw) & (m <= xf.max_raw)
        if hit.any():
            counters = [rng.randint(0, cfg.counter_max) for _ in range(cfg.n_intervals)]
            return qv, int(m[hit.nonzero()[0, 0]]), [(pos, mode, counters)]
    return None


@cocotb.test()
async def md_matches_golden(dut):
    bench, (q, k, v), model, recs = await open_bench(dut)
    cfg, rng, p = bench.cfg, bench.rng, bench.params
    xf, nb = cfg.sfm.x_format, cfg.beats
    steps = q.shape[0]
    q_src = bench.source("q_load", beat_load_layout(cfg))
    cand_src = bench.source("cand", candidate_layout(cfg))
    verdict_sink = bench.sink("verdict", candidate_layout(cfg))
    memory = bench.memory("kv_req", kv_request_layout(cfg), "kv_resp", beat_layout(cfg), kv_lookup(k, v, cfg.lanes))
    corr_sink = bench.sink("corr", ac_command_layout(cfg), hold=p.get("corr_hold", 1))
    busy_at: dict[int, int] = {}

    async def watch_busy():
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            busy_at[bench.cycles.now] = int(dut.busy.value)
    cocotb.start_soon(watch_busy())

    # the trace's steps (candidates of the tile + extras), then corner steps with extreme m
    plan = []
    extra = p.get("extra_candidates", 2)
    for rec in recs:
        cands = list(zip(rec.cand, rec.cand_mode, rec.cand_counters))
        plan.append((rec.q, rec.m, cands + random_candidates(cfg, rng, extra if rec.n else 0, rec.n or 1)))
    for m in (xf.max_raw, xf.min_raw, 0, xf.min_raw + 1, xf.max_raw - 1)[:p.get("corner_steps", 5)]:
        # (candidate positions inside the metadata's range: a fuzzed max_positions may be below the steps)
        plan.append((q[rng.randrange(steps)].tolist(), m, random_candidates(cfg, rng, 6, min(steps, cfg.max_positions))))
    for _ in range(p.get("rounding_steps", 4)):
        step = rounding_edge_step(cfg, model, q[rng.randrange(steps)].tolist(), k, rng, min(steps, cfg.max_positions))
        plan += [step] if step else []

    want_kv = []
    corr_of = []     # the candidate (its index in cand_src's order) of each expected correction
    totals = {"active": 0, "false_alarms": 0, "mode_changes": 0}
    halvings, x_saturated, rounding_edges, intervals_seen = 0, 0, 0, set()
    for step, (qv, m, cands) in enumerate(plan):
        await load_vector(bench, q_src, qv)
        dut.m.value = m & ((1 << xf.width) - 1)
        if not cands:
            continue
        pos = torch.tensor([c[0] for c in cands], dtype=torch.int64)
        mode = torch.tensor([c[1] for c in cands], dtype=torch.int64)
        counters = torch.tensor([c[2] for c in cands], dtype=torch.int64)
        decided = model.md_decide(torch.tensor(qv), m, k[pos], mode, counters).verdicts()
        for (pj, mj, cj), g in zip(cands, decided):
            what = f"step {step} candidate {pj}"
            cand_src.put({"position": pj, "mode": mj, "counters": cj})
            index = len(verdict_sink.expected)
            verdict_sink.expect({"position": pj, "mode": g.mode, "counters": g.counters}, inputs=what)
            want_kv += [{"value": 0, "position": pj, "beat": b} for b in range(nb)]
            halvings += int(cj[g.r] + 1 > cfg.counter_max)
            if g.active:
                want_kv += [{"value": 1, "position": pj, "beat": b} for b in range(nb)]
                for kb, vb in zip(beats(k[pj], cfg), beats(v[pj], cfg)):
                    corr_sink.expect({"op": AcOp.BEATS, "w": g.w, "alpha": g.alpha, "beta": g.beta, "accumulate": 1,
                                      "update": int(g.change), "k": kb, "v": vb}, inputs=what)
                    corr_of.append(index)
        intervals_seen.update(g.r for g in decided)
        rounding_edges += sum(1 for g in decided if g.active and at_rounding_edge(g.alpha, g.x, g.beta, cfg.sfm))
        x_saturated += sum(1 for g in decided if g.x in (xf.min_raw, xf.max_raw))
        totals["active"] += sum(g.active for g in decided)
        totals["false_alarms"] += sum(not g.active for g in decided)
        totals["mode_changes"] += sum(g.change for g in decided)
        budget = len(cands) * 40 * nb + 2000
        await verdict_sink.wait_for(len(verdict_sink.expected), timeout_cycles=budget)
        await corr_sink.wait_for(len(corr_sink.expected), timeout_cycles=budget)
        await bench.until(lambda: cand_src.idle and not int(dut.busy.value), budget, "MD idle")
        bench.check(f"step {step} counters", {key: int(getattr(dut, key).value) for key in totals}, dict(totals))
    await bench.drain(timeout_cycles=2000, settle=50)
    # keys in candidate order, values in active order (MD interleaves the two streams)
    got_kv = memory.requests.items
    for kind in (0, 1):
        bench.compare(f"kv_req {'value' if kind else 'key'}", [r for r in got_kv if r["value"] == kind],
                      [r for r in want_kv if r["value"] == kind])
    bench.check("kv_req count", len(got_kv), len(want_kv))
    # pipelining: a candidate's key read issued before the previous candidate's verdict left
    key_starts = [cyc for cyc, r in memory.requests.received if r["value"] == 0 and r["beat"] == 0]
    verdict_at = [cyc for cyc, _ in verdict_sink.received]
    overlapped = sum(1 for i in range(1, min(len(key_starts), len(verdict_at))) if key_starts[i] < verdict_at[i - 1])
    # busy: high from the cycle after a candidate is taken through the cycle its verdict leaves
    # and, for an active, through the cycle its last correction leaves (the tile's sequencer ends
    # the step's corrections when busy drops)
    spans = [(a + 1, v) for (a, _), (v, _) in zip(cand_src.sent, verdict_sink.received)]
    spans += [(cand_src.sent[i][0] + 1, c) for i, (c, _) in zip(corr_of, corr_sink.received)]
    bench.check("busy low while a candidate awaits its verdict or corrections",
                [t for lo, hi in spans for t in range(lo, hi + 1) if not busy_at.get(t, 1)][:5], [])
    bench.finish(
        vectors=len(verdict_sink.expected), steps=len(plan), candidates=len(verdict_sink.expected),
        trace_candidates=sum(len(r.cand) for r in recs), **totals, halvings=halvings,
        corr=len(corr_sink.expected), kv_requests=len(want_kv), overlapped=overlapped,
        nonzero_w=sum(1 for c, _ in corr_sink.expected if c["w"] != 0), rounding_edges=rounding_edges,
        busy_cycles_checked=sum(hi - lo + 1 for lo, hi in spans),
        intervals_seen=sorted(intervals_seen), x_saturated=x_saturated)
