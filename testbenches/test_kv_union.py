"""The KV port of a KV group's heads (hdl/lad/kv_union.py) under Amaranth's simulator: each head
gets exactly the responses to its own requests, in its order, under random gaps, back-pressure and
KV-memory latency (seeded), and a request offered to the KV memory stays until taken; with ascending requests presented without gaps the KV memory sees each
distinct request once (the union of the heads' reads), and never more requests than the heads made."""
import random

import pytest
from amaranth import unsigned
from amaranth.sim import Simulator

from golden.dense import DenseConfig
from hdl.lad.dense import kv_request_layout
from hdl.lad.kv_union import KvUnion

CFG = DenseConfig(head_dim=32, lanes=8, max_positions=64)   # 4 beats a key or value


def head_requests(rng, positions: int, share: float, ascending: bool) -> list[tuple[int, int, int]]:
    """One head's (position, value, beat) requests: the keys of a random subset of positions (each
    with probability ``share``), the values of some of them; ascending (as APID orders a step's
    candidates), or an active's value read moved ahead of later keys (as MD issues it)."""
    reqs = []
    for p in range(positions):
        if rng.random() < share:
            reqs += [(p, 0, b) for b in range(CFG.beats)]
            if rng.random() < 0.4:
                reqs += [(p, 1, b) for b in range(CFG.beats)]
    if not ascending and len(reqs) > 3 * CFG.beats:
        cut = rng.randrange(len(reqs) // 2)
        reqs = reqs[cut:cut + CFG.beats] + reqs[:cut] + reqs[cut + CFG.beats:]
    return reqs


def word(req) -> int:
    """The KV memory's response to a request (a distinct value per request)."""
    p, v, b = req
    return (p * 2 + v) * CFG.beats + b


def run(seed: int, heads: int, ascending: bool, gap: float, stall: float, latency: tuple[int, int], inflight: int = 6):
    rng = random.Random(seed)
    lists = [head_requests(rng, 40, rng.choice((0.3, 0.6, 0.9)), ascending) for _ in range(heads)]
    dut = KvUnion(kv_request_layout(CFG), unsigned(16), heads, inflight)
    got = [[] for _ in range(heads)]
    issued = []

    async def bench(ctx):
        nxt = [0] * heads
        offered = [False] * heads
        memory = []   # (ready cycle, word), in request order
        cycle, waiting = 0, None
        while any(len(g) < len(lst) for g, lst in zip(got, lists)):
            assert cycle < 20000, "the KV port stopped"
            for h, req in enumerate(dut.req):   # a request once offered stays until taken
                if not offered[h] and nxt[h] < len(lists[h]) and rng.random() >= gap:
                    offered[h] = True
                    p, v, b = lists[h][nxt[h]]
                    ctx.set(req.payload, {"position": p, "value": v, "beat": b})
                ctx.set(req.valid, offered[h])
                ctx.set(dut.resp[h].ready, rng.random() >= stall)
            ctx.set(dut.kv_req.ready, rng.random() >= stall)
            head_ready = bool(memory) and memory[0][0] <= cycle
            ctx.set(dut.kv_resp.valid, head_ready)
            if head_ready:
                ctx.set(dut.kv_resp.payload, memory[0][1])
            taken = [ctx.get(req.valid) and ctx.get(req.ready) for req in dut.req]
            pl = ctx.get(dut.kv_req.payload)
            req = (pl["position"], pl["value"], pl["beat"])
            if waiting is not None:   # a request offered and not taken stays, unchanged
                assert ctx.get(dut.kv_req.valid) and req == waiting, f"cycle {cycle}: {waiting} withdrawn for {req}"
            waiting = req if ctx.get(dut.kv_req.valid) and not ctx.get(dut.kv_req.ready) else None
            if ctx.get(dut.kv_req.valid) and ctx.get(dut.kv_req.ready):
                issued.append(req)
                memory.append((cycle + rng.randint(*latency), word(req)))
            for h, resp in enumerate(dut.resp):
                if ctx.get(resp.valid) and ctx.get(resp.ready):
                    got[h].append(ctx.get(resp.payload))
            if ctx.get(dut.kv_resp.valid) and ctx.get(dut.kv_resp.ready):
                memory.pop(0)
            for h in range(heads):
                if taken[h]:
                    offered[h] = False
                    nxt[h] += 1
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return lists, got, issued


@pytest.mark.parametrize("seed, heads, ascending, gap, stall, latency",
                         [(1, 3, True, 0.3, 0.3, (1, 8)), (2, 3, False, 0.3, 0.3, (1, 8)), (3, 2, False, 0.5, 0.5, (1, 3)),
                          (4, 4, True, 0.2, 0.1, (1, 12))])
def test_kv_union_gives_each_head_its_own_responses(seed, heads, ascending, gap, stall, latency):
    lists, got, issued = run(seed, heads, ascending, gap, stall, latency)
    for h in range(heads):
        assert got[h] == [word(r) for r in lists[h]], f"head {h}"
    union = set().union(*(set(lst) for lst in lists))
    assert len(union) <= len(issued) <= sum(len(lst) for lst in lists)
    assert set(issued) == union
    assert min(len(lst) for lst in lists) > 0 and len(union) < sum(len(lst) for lst in lists)   # shared reads exist


def test_kv_union_reads_the_union_of_ascending_requests_once():
    """All requests presented without gaps and ascending: each distinct request is issued once."""
    lists, got, issued = run(5, 3, True, 0.0, 0.3, (1, 8))
    for h in range(3):
        assert got[h] == [word(r) for r in lists[h]]
    assert sorted(issued) == sorted(set().union(*(set(lst) for lst in lists)))
    assert len(issued) < sum(len(lst) for lst in lists)
