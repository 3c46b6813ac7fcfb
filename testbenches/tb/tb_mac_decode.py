"""cocotb: MAC decode engine (hdl/mac/decode.py) == golden.mac_decode.MacDecodeHead, one model
per head stepping n = 0, 1, 2, ...: every output beat (m, s, o) and every statistics beat
(engaged, hit, matched position and distance, fallback, keys read), and every KV and entry-store
request (head, K or V, first, count; read or write, head, slot, beat and a write's m, s, o) against
the model's program (HeadStep.passes). The bench plays the KV memory
(bursts: one request, ``count·d/L`` response beats) and the entry store (read beats answered,
writes stored) as memories with random latency, request back-pressure and response gaps; random
gaps on ``query``, back-pressure on ``out``.

Params: ``steps`` (positions per head), ``heads_used``, ``seq_seed`` (the random sequence of
testbenches/tb/mac_decode_steps.py: clustered and repeated pre-RoPE queries, queries aligned with the
newest key so removals cancel), ``trace`` (real SmolLM2 layer-12 head-0 steps instead; one head;
a path: that recorded trace, with ``head_trace``), ``start`` (the first position the engine steps:
the positions before it are only in the KV memory, as after a prompt processed elsewhere),
``gap`` / ``stall`` / ``latency`` (0 / 0 / [1, 1] for the cycle measurement), ``out_stall``
(back-pressure on ``out`` alone, whose stalled cycles the statistic leaves out), ``reuse_off``
(the share of steps whose query carries ``reuse = 0``, drawn per step from ``seed + 1``)."""
from __future__ import annotations

import random

import cocotb

from golden.mac_decode import MacDecodeConfig, MacDecodeHead, engine_step_cycles, head_step_cycles, step_ranges
from hdl.mac.decode import (entry_request_layout, entry_response_layout, kv_request_layout, kv_response_layout,
                            out_layout, query_layout)
from testbenches.streams import Bench, split_beats
from testbenches.tb.mac_decode_steps import random_sequence, real_trace


def sequence(bench: Bench):
    """Raw ``(q_pre (N, H, d), q (N, H, d), k (1, N, d), v (1, N, d))`` of the run."""
    cfg, p = bench.cfg, bench.params
    if p.get("trace"):
        paths = (p["trace"], p["head_trace"]) if p.get("head_trace") else (None, None)
        return real_trace(cfg, min(p.get("start", 0) + bench.steps(64), cfg.max_positions), *paths)
    H = p.get("heads_used", cfg.heads)
    return random_sequence(cfg, H, 1, min(p.get("start", 0) + bench.steps(30), cfg.max_positions),
                           p.get("seq_seed", bench.seed))


@cocotb.test()
async def mac_decode_matches_golden(dut):
    bench = await Bench.start(dut, MacDecodeConfig)
    cfg, p = bench.cfg, bench.params
    q_pre, q, k, v = sequence(bench)
    N, H = q.shape[0], q.shape[1]
    lanes, nb = cfg.lanes, cfg.beats

    def kv_lookup(req):
        table = v[0] if req["value"] else k[0]
        return [table[pos, b * lanes:(b + 1) * lanes].tolist()
                for pos in range(req["first"], req["first"] + req["count"]) for b in range(nb)]

    store = {}

    def entry_lookup(req):
        key = (req["head"], req["slot"], req["beat"])
        if req["write"]:
            store[key] = {"m": req["m"], "s": req["s"], "o": req["o"]}
            return []
        return [store.get(key, {"m": 0, "s": 0, "o": [0] * lanes})]

    src, sink = bench.source("query", query_layout(cfg)), bench.sink("out", out_layout(cfg), stall=p.get("out_stall"))
    kv = bench.memory("kv_req", kv_request_layout(cfg), "kv_resp", kv_response_layout(cfg), kv_lookup, (1, 6),
                      burst=True)
    es = bench.memory("es_req", entry_request_layout(cfg), "es_resp", entry_response_layout(cfg), entry_lookup,
                      (1, 6), burst=True)

    heads = [MacDecodeHead(cfg) for _ in range(H)]
    reuse_rng, reuse_off = random.Random(bench.seed + 1), p.get("reuse_off", 0.0)
    kv_want, es_want = [], []   # (request, its step) in order, from the model's program
    count = dict(hits=0, misses=0, fallbacks=0, idle=0, steps=0, reuse_off=0)
    model_cycles, engine_cycles, keys_list, kinds, total_keys = [], [], [], [], 0
    start = p.get("start", 0)
    for n in range(start, N):
        F, lo_tail, L = step_ranges(cfg, n)
        for h in range(H):
            reuse = not (reuse_off and reuse_rng.random() < reuse_off)
            src.put(*({"head": h, "position": n, "reuse": int(reuse), "q_pre": a, "q": b}
                      for a, b in zip(split_beats(q_pre[n, h], lanes), split_beats(q[n, h], lanes))))
            o, st = heads[h].step(q_pre[n, h], q[n, h], k[0, :n + 1], v[0, :n + 1], n, reuse)
            count["reuse_off"] += cfg.reuse and L >= cfg.min_context and not reuse
            where = f"step {n} head {h}"
            lo_mid = L + F - st.kv_keys                      # the K pass: the sinks, then [lo_mid, L)
            reads = [(0, 0, F), (0, lo_mid, L)] + [(1, lo, hi) for lo, hi in st.passes]
            for value, lo, hi in reads:
                if hi > lo:
                    kv_want.append(({"head": h, "value": value, "first": lo, "count": hi - lo}, where))
            slot = st.slot
            back = n - st.position                          # the matched entry's slot, then the new one's
            for b in range(nb if st.hit else 0):
                es_want.append(({"write": 0, "head": h, "slot": (slot - back) % cfg.window, "beat": b}, where))
            for b in range(nb):
                es_want.append(({"write": 1, "head": h, "slot": slot, "beat": b, "m": heads[h].entry_m[slot],
                                 "s": heads[h].entry_s[slot], "o": heads[h].entry_o[slot][b * lanes:(b + 1) * lanes]},
                                where))
            for b, ob in enumerate(split_beats(o, lanes)):
                sink.expect({"stats": 0, "m": st.m, "s": st.s, "o": ob}, inputs=f"{where} beat {b}")
            sink.expect({"stats": 1, "engaged": int(st.engaged), "hit": int(st.hit), "fallback": int(st.fallback),
                         "position": st.position if st.engaged else 0, "distance": st.distance if st.engaged else 0,
                         "keys": st.kv_keys}, inputs=f"{where} stats")
            count["hits"] += st.hit
            count["misses"] += st.engaged and not st.hit
            count["fallbacks"] += st.fallback
            count["idle"] += not st.engaged
            count["steps"] += 1
            total_keys += st.kv_keys
            keys_list.append(st.kv_keys)
            kinds.append("idle" if not st.engaged else "hit" if st.hit else "fallback" if st.fallback else "miss")
            filled = min(n - start, cfg.window)
            model_cycles.append(int(head_step_cycles(cfg, L, st.kv_keys, int(st.hit), st.engaged, filled,
                                                     int(st.fallback) * (lo_tail - F))))
            engine_cycles.append(engine_step_cycles(cfg, st, filled))
    timeout = sum(keys_list) * nb * 60 + count["steps"] * (cfg.window * nb * 4 + 2000) + 10000
    await bench.drain(timeout_cycles=timeout)
    bench.compare("kv_req", [r for _, r in kv.requests.received], *map(list, zip(*kv_want)))
    es_got = [{k: r[k] for k in ("write", "head", "slot", "beat", *(("m", "s", "o") if r["write"] else ()))}
              for _, r in es.requests.received]
    bench.compare("es_req", es_got, *map(list, zip(*es_want)))
    stats = [item for item in sink.items if item["stats"]]
    # cycles between a step's first o beat and its statistics beat beyond the d/L of a free port
    beat_cycles = [cyc for cyc, _ in sink.received]
    out_waits = sum(beat_cycles[j + nb] - beat_cycles[j] - nb for j in range(0, len(beat_cycles) - nb, nb + 1))
    bench.finish(vectors=count["steps"], beats=len(sink.expected), **count,
                 rtl_cycles=[s["cycles"] for s in stats], model_cycles=model_cycles, engine_cycles=engine_cycles,
                 out_waits=out_waits,
                 kv_keys=keys_list, kinds=kinds,
                 kv_requests=len(kv.requests.received), entry_requests=len(es.requests.received),
                 nonzero_outputs=sum(1 for w, _ in sink.expected if not w["stats"] and any(w["o"])))
