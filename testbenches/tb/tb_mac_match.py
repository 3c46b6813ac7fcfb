"""cocotb: MAC Match unit == golden.mac_unit.MatchModel on a query sequence: random
queries, near-repeats (hits), exact repeats (ties -> lower position), distances exactly
at and one below the threshold, empty and partly filled windows, ring wrap-around, a random
head on every beat but a query's first;
optionally real SmolLM2 pre-RoPE queries. Random gaps on ``query``, back-pressure on ``result``."""
from __future__ import annotations

import math

import cocotb
import torch

from golden.mac_unit import MacUnitConfig, MatchModel
from hdl.mac.match import match_query_layout, match_result_layout
from testbenches.streams import Bench, split_beats


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


def queries_of(bench: Bench) -> list[tuple[int, list[int]]]:
    """The run's (head, query) sequence: ``trace`` (vectors positions of every head) or synthetic."""
    p = bench.params
    if p.get("trace"):
        return trace_queries(bench.cfg, p["trace"], bench.vectors(100))
    return synthetic_queries(bench.cfg, bench.rng, bench.vectors(1000), p.get("heads_used"))


def match_half(bench: Bench, query: str = "query", result: str = "result"):
    """Match on ports ``query`` / ``result``: the run's queries queued with their golden results
    (golden.mac_unit.MatchModel). Returns the drain timeout and the report's fields (call it
    after the drain)."""
    cfg = bench.cfg
    src, sink = bench.source(query, match_query_layout(cfg)), bench.sink(result, match_result_layout(cfg))
    queries = queries_of(bench)
    model = MatchModel(cfg)
    want = []
    for n, (head, q) in enumerate(queries):
        r = model.query(head, torch.tensor(q))
        # the head is read from the first beat: the others carry a random one
        src.put(*({"head": head if b == 0 else bench.rng.randrange(cfg.heads), "q": beat}
                  for b, beat in enumerate(split_beats(q, cfg.lanes))))
        want.append({"hit": int(r.hit), "slot": r.slot, "position": r.position, "distance": r.distance})
        sink.expect(want[-1], inputs=f"query {n}, head {head}")

    def report() -> dict:
        return {"vectors": len(want), "hits": sum(w["hit"] for w in want),
                "at_threshold": sum(1 for w in want if w["distance"] == cfg.threshold_raw),
                "distances": [w["distance"] for w in want], "hits_list": [w["hit"] for w in want],
                "result_cycles": [c for c, _ in sink.received]}
    return len(queries) * (cfg.window + 4) * cfg.beats * 4 + 10000, report


@cocotb.test()
async def match_matches_golden(dut):
    bench = await Bench.start(dut, MacUnitConfig)
    timeout, report = match_half(bench)
    await bench.drain(timeout_cycles=timeout)
    bench.finish(**report())
