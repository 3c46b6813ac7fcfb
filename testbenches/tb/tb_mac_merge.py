"""cocotb: MAC Merge unit == golden.mac_unit.merge_bits on merges and removals: random
states, equal maxima, far-apart maxima (exp underflow), maxima 16 to 48 apart with sums up to
the format's top (EXP2 shifts up to the products' width), tiny sums (RECIP shifts 0 and 1),
zero-weight states, sum saturation, cancellation exactly at and around the bound (s 2^cb - a
= -1 and 0), a saturated sum removed; optionally real states from
SmolLM2. Random gaps on ``i``, back-pressure on ``o``."""
from __future__ import annotations

import cocotb
import torch

from golden.fixedpoint import saturate
from golden.mac_unit import MacUnitConfig, MergeOp, merge_bits
from hdl.mac.merge import merge_in_layout, merge_out_layout
from testbenches.streams import Bench, split_beats


def random_state(cfg, rng):
    of = cfg.out_format
    sf = cfg.score_format   # m and s within their formats (a narrow config's may hold less than 8 and 300)
    m = saturate(rng.randint(-(8 << cfg.score_frac), 8 << cfg.score_frac), sf)
    s = saturate(rng.choice((rng.randint(1 << cfg.sum_frac, 300 << cfg.sum_frac), rng.randint(1, 1 << cfg.sum_frac))),
                 cfg.sum_format)
    o = [rng.randint(of.min_raw // 8, of.max_raw // 8) for _ in range(cfg.head_dim)]
    return m, s, o


def synthetic_cases(cfg, rng, n):
    cases = []
    smax, sfmt = cfg.sum_format.max_raw, cfg.score_format
    for _ in range(n):
        op = rng.choice((MergeOp.MERGE, MergeOp.DOWNDATE))
        (m1, s1, o1), (m2, s2, o2) = random_state(cfg, rng), random_state(cfg, rng)
        kind = rng.random()
        if kind < 0.15:
            m2 = m1  # equal maxima
        elif kind < 0.2:
            m2 = rng.choice((sfmt.min_raw, sfmt.max_raw))  # far apart: exp underflows to 0
        elif kind < 0.25:
            s2 = 0  # zero-weight state
        elif kind < 0.3:
            s1, s2, op = smax, smax, MergeOp.MERGE  # sum saturates
        elif kind < 0.45:  # removal at the cancellation bound: s*2^cb vs a, equal maxima
            op, m2 = MergeOp.DOWNDATE, m1
            s2 = saturate(s1 - (s1 >> cfg.cancel_bits) + rng.randint(-2, 2), cfg.sum_format)
        elif kind < 0.5:
            op, m2, s2 = MergeOp.DOWNDATE, m1, s1  # complete cancellation
        elif kind < 0.6:  # maxima 16 to 48 apart: EXP2's shifts past 32, up to the product's width and beyond
            gap = rng.randint(16 << cfg.score_frac, 48 << cfg.score_frac)
            m2 = saturate(m1 + rng.choice((-gap, gap)), sfmt)
            s1, s2 = (rng.choice((rng.randint(smax // 2, smax), rng.randint(1, smax))) for _ in range(2))
        elif kind < 0.65:  # tiny sums: RECIP's shifts 0 and 1 (s = 1, 2, 3)
            op, m2 = MergeOp.MERGE, m1
            s1 = rng.randint(0, 3)
            s2 = rng.randint(1 if s1 == 0 else 0, 3 - s1) if s1 < 3 else 0
        elif kind < 0.7:  # removal exactly at the bound: s 2^cb - a = -1 (flagged) or 0 (kept)
            op, m2 = MergeOp.DOWNDATE, m1
            k = rng.randint(1, max(1, smax >> (cfg.cancel_bits + 1)))   # (a narrow sum: clamped below)
            s1 = saturate((k << cfg.cancel_bits) + rng.randint(0, 1), cfg.sum_format)
            s2 = s1 - k
        elif kind < 0.72:  # a saturated sum removed from a smaller one: the sign test's widest value
            op, m2, s2 = MergeOp.DOWNDATE, m1, smax
        cases.append((op, m1, s1, o1, m2, s2, o2))
    cases.append((MergeOp.MERGE, 0, 0, [0] * cfg.head_dim, 0, 0, [0] * cfg.head_dim))  # two empty states
    return cases


def cases_of(bench: Bench) -> list[tuple]:
    """The run's (op, m1, s1, o1, m2, s2, o2) cases: ``trace`` (real states) or synthetic;
    ``only_op`` ("merge" / "downdate") forces every synthetic case's op."""
    p = bench.params
    if p.get("trace"):
        return [tuple(c) for c in torch.load(p["trace"])["merge_cases"]][:bench.vectors(1000)]
    cases = synthetic_cases(bench.cfg, bench.rng, bench.vectors(1000))
    if p.get("only_op"):
        op = MergeOp.MERGE if p["only_op"] == "merge" else MergeOp.DOWNDATE
        cases = [(op,) + tuple(c[1:]) for c in cases]
    return cases


def merge_half(bench: Bench, i: str = "i", o: str = "o"):
    """Merge on ports ``i`` / ``o``: the run's cases queued with their golden output beats
    (golden.mac_unit.merge_bits). Returns the drain timeout and the report's fields (call it
    after the drain)."""
    cfg = bench.cfg
    src, sink = bench.source(i, merge_in_layout(cfg)), bench.sink(o, merge_out_layout(cfg))
    cases = cases_of(bench)
    want, flagged = [], 0
    for n, (op, m1, s1, o1, m2, s2, o2) in enumerate(cases):
        src.put(*({"op": op, "m1": m1, "s1": s1, "m2": m2, "s2": s2, "o1": b1, "o2": b2}
                  for b1, b2 in zip(split_beats(o1, cfg.lanes), split_beats(o2, cfg.lanes))))
        r = merge_bits(op, m1, s1, torch.tensor(o1), m2, s2, torch.tensor(o2), cfg)
        flagged += r.flagged
        for b, ob in enumerate(split_beats(r.o, cfg.lanes)):
            want.append({"m": r.m, "s": r.s, "flagged": int(r.flagged), "o": ob})
            sink.expect(want[-1], inputs=f"case {n} beat {b}: op {op}, m {m1} {m2}, s {s1} {s2}")

    def report() -> dict:
        return {"vectors": len(cases), "beats": len(want), "flagged": flagged,
                "nonzero_outputs": sum(1 for w in want if any(w["o"])), "output_cycles": [c for c, _ in sink.received]}
    return len(want) * 60 + 10000, report


@cocotb.test()
async def merge_matches_golden(dut):
    bench = await Bench.start(dut, MacUnitConfig)
    timeout, report = merge_half(bench)
    await bench.drain(timeout_cycles=timeout)
    bench.finish(**report())
