"""cocotb: MAC Match unit == golden.mac_unit.MatchModel on a query sequence: random
queries, near-repeats (hits), exact repeats (ties -> lower position), distances exactly
at and one below the threshold, empty and partly filled windows, ring wrap-around;
optionally real SmolLM2 pre-RoPE queries. Random gaps on ``query``, back-pressure on ``result``."""
from __future__ import annotations

import math

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.mac_unit import MacUnitConfig, MatchModel
from hdl.mac.match import match_query_layout, match_result_layout
from testbenches.streams import Context, StreamSink, StreamSource, start


def vector_with_squared_norm(target: int, d: int, rng) -> list[int]:
    """Integers whose squares sum exactly to ``target`` (greedy; None if d is too small)."""
    out = []
    for _ in range(d):
        x = math.isqrt(target)
        out.append(x if rng.random() < 0.5 else -x)
        target -= x * x
    return out if target == 0 else None


def synthetic_queries(cfg: MacUnitConfig, rng, n: int, heads: int | None = None) -> list[tuple[int, list[int]]]:
    lo, hi = cfg.q_format.min_raw, cfg.q_format.max_raw
    span = hi // 2
    history = {h: [] for h in range(cfg.heads)}
    out = []
    for _ in range(n):
        head = rng.randrange(heads or cfg.heads)
        past = history[head][-cfg.window:]
        kind = rng.random()
        if past and kind < 0.3:  # near repeat: a hit
            base = rng.choice(past)
            q = [max(lo, min(hi, v + rng.randint(-3, 3))) for v in base]
        elif past and kind < 0.4:  # exact repeat: ties with any other copy
            q = list(rng.choice(past))
        elif past and kind < 0.5:  # exactly at / one below the threshold from an earlier query
            base = rng.choice(past)
            delta = vector_with_squared_norm(cfg.threshold_raw - rng.choice((0, 1)), cfg.head_dim, rng)
            q = [v + dv for v, dv in zip(base, delta)] if delta else list(base)
            if any(not lo <= v <= hi for v in q):
                q = list(base)
        else:
            q = [rng.randint(-span, span) for _ in range(cfg.head_dim)]
        history[head].append(q)
        out.append((head, q))
    return out


def trace_queries(cfg: MacUnitConfig, path: str, limit: int) -> list[tuple[int, list[int]]]:
    """Real pre-RoPE queries (positions x heads x d, float) quantised to the unit's format."""
    q = torch.load(path)["q_pre"][:, :cfg.heads, :cfg.head_dim]
    raw = cfg.q_format.quantize(q)
    return [(h, raw[t, h].tolist()) for t in range(min(limit, raw.shape[0])) for h in range(cfg.heads)]


@cocotb.test()
async def match_matches_golden(dut):
    ctx = Context(MacUnitConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    cycles = await start(dut)
    src = StreamSource(dut, "query", match_query_layout(cfg), cycles, rng, gap=p.get("gap", 0.3))
    sink = StreamSink(dut, "result", match_result_layout(cfg), cycles, rng, stall=p.get("stall", 0.3))
    if p.get("trace"):
        queries = trace_queries(cfg, p["trace"], p.get("vectors", 100))
    else:
        queries = synthetic_queries(cfg, rng, p.get("vectors", 1000), p.get("heads_used"))
    model = MatchModel(cfg)
    want = []
    for head, q in queries:
        for b in range(cfg.beats):
            src.put({"head": head, "q": q[b * cfg.lanes:(b + 1) * cfg.lanes]})
        r = model.query(head, torch.tensor(q))
        want.append({"hit": int(r.hit), "slot": r.slot, "position": r.position, "distance": r.distance})
    start_cycle = cycles.now
    await sink.wait_for(len(want), timeout_cycles=len(want) * (cfg.window + 4) * cfg.beats * 4 + 10000)
    await ClockCycles(dut.clk, 20)
    assert len(sink.received) == len(want)
    mismatches = [f"#{n} head {queries[n][0]}: rtl {got} golden {w}"
                  for n, ((_, got), w) in enumerate(zip(sink.received, want)) if got != w]
    hits = sum(w["hit"] for w in want)
    at_threshold = sum(1 for w in want if w["distance"] == cfg.threshold_raw)
    ctx.report.update(vectors=len(want), mismatches=len(mismatches), hits=hits, at_threshold=at_threshold,
                      cycles=cycles.now - start_cycle,
                      distances=[w["distance"] for w in want], hits_list=[w["hit"] for w in want],
                      result_cycles=[c for c, _ in sink.received])
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
