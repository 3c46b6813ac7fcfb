"""cocotb: dense PWL attention == golden.dense.dense_attention_bits, step after step, with
a KV memory model (random latency, request back-pressure, response gaps) and random
gaps/back-pressure on the query and output streams; random or real SmolLM2 q/k/v."""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.dense import DenseConfig, dense_attention_bits
from hdl.lad.dense import dense_out_layout, dense_query_layout, kv_request_layout, kv_response_layout
from testbenches.streams import Context, StreamMemory, StreamSink, StreamSource, start


def random_steps(cfg: DenseConfig, rng, steps: int, max_len: int, fixed_len: int | None = None):
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    f = cfg.kv_format
    n_total = max_len
    scale = [rng.choice((0.5, 1.0, 3.0)) for _ in range(3)]
    k = f.quantize(torch.randn(n_total, cfg.head_dim, generator=gen) * scale[0])
    v = f.quantize(torch.randn(n_total, cfg.head_dim, generator=gen) * scale[1])
    k[0] = f.max_raw  # corner: extreme key and value rows
    v[1] = f.min_raw
    out = []
    for s in range(steps):
        length = fixed_len or rng.choice((1, 2, rng.randint(1, max_len), max_len))
        q = f.quantize(torch.randn(cfg.head_dim, generator=gen) * scale[2] * (4 if s % 5 == 0 else 1))
        out.append((q, length))
    return k, v, out


def trace_steps(cfg: DenseConfig, path: str, steps: int, max_len: int):
    t = torch.load(path)
    f = cfg.kv_format
    q, k, v = (f.quantize(t[name][:, :cfg.head_dim].float()) for name in ("q", "k", "v"))
    positions = torch.linspace(8, min(max_len, q.shape[0]) - 1, steps).round().long().tolist()
    return k, v, [(q[p], p + 1) for p in positions]


@cocotb.test()
async def dense_matches_golden(dut):
    ctx = Context(DenseConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    max_len = min(p.get("max_len", 64), cfg.max_positions)
    if p.get("trace"):
        k, v, steps = trace_steps(cfg, p["trace"], p.get("steps", 4), max_len)
    else:
        k, v, steps = random_steps(cfg, rng, p.get("steps", 20), max_len, p.get("fixed_len"))
    cycles = await start(dut)
    gap, stall = p.get("gap", 0.3), p.get("stall", 0.3)
    src = StreamSource(dut, "query", dense_query_layout(cfg), cycles, rng, gap=gap)
    sink = StreamSink(dut, "out", dense_out_layout(cfg), cycles, rng, stall=stall)
    lanes = cfg.lanes

    def lookup(req):
        table = v if req["value"] else k
        return table[req["position"], req["beat"] * lanes:(req["beat"] + 1) * lanes].tolist()

    memory = StreamMemory(dut, "kv_req", kv_request_layout(cfg), "kv_resp", kv_response_layout(cfg), cycles, rng,
                          lookup, latency=tuple(p.get("latency", (1, 6))), stall=stall, gap=gap)
    want = []
    for q, length in steps:
        for b in range(cfg.beats):
            src.put({"q": q[b * lanes:(b + 1) * lanes].tolist(), "length": length})
        o, m, z = dense_attention_bits(q, k[:length], v[:length], cfg)
        for b in range(cfg.beats):
            want.append({"o": o[b * lanes:(b + 1) * lanes].tolist(), "m": m, "z": z,
                         "kv_beats": 2 * length * cfg.beats})
    total = sum(length for _, length in steps)
    await sink.wait_for(len(want), timeout_cycles=total * cfg.beats * 2 * 30 + 5000)
    await ClockCycles(dut.clk, 20)
    assert len(sink.received) == len(want)
    mismatches = []
    for n, ((_, got), w) in enumerate(zip(sink.received, want)):
        got_cmp = {key: got[key] for key in w}
        if got_cmp != w:
            mismatches.append(f"beat #{n}: rtl {got_cmp} golden {w}")
    reqs = memory.requests.received
    ctx.report.update(steps=len(steps), vectors=len(steps), beats=len(want), mismatches=len(mismatches), kv_requests=len(reqs),
                      step_cycles=[got["cycles"] for _, got in sink.received[::cfg.beats]],
                      lengths=[length for _, length in steps],
                      nonzero_outputs=sum(1 for w in want if any(w["o"])))
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
