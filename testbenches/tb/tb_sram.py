"""cocotb: SRAM bank == golden.sram.SramModel: random writes and reads on every port at
once, replayed in cycle order (reads see writes of earlier cycles), with random gaps on
the write and request streams and random back-pressure on every response stream."""
from __future__ import annotations

import cocotb
from amaranth import unsigned
from cocotb.triggers import ClockCycles

from golden.sram import SramConfig, SramModel
from hdl.lib.sram import sram_read_layout, sram_write_layout
from testbenches.streams import Context, StreamSink, StreamSource, start


@cocotb.test()
async def sram_matches_model(dut):
    ctx = Context(SramConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    n = p.get("vectors", 1000)
    cycles = await start(dut)
    writer = StreamSource(dut, "write", sram_write_layout(cfg), cycles, rng, gap=p.get("gap", 0.3))
    ports = []
    for k in range(cfg.read_ports):
        req = StreamSource(dut, f"read{k}_req", sram_read_layout(cfg), cycles, rng, gap=p.get("gap", 0.3))
        resp = StreamSink(dut, f"read{k}_resp", unsigned(cfg.width), cycles, rng, stall=p.get("stall", 0.3))
        ports.append((req, resp))
    hot = [0, cfg.depth - 1, rng.randrange(cfg.depth)]  # corner addresses, reused to collide
    top = (1 << cfg.width) - 1
    for _ in range(n):
        addr = rng.choice(hot) if rng.random() < 0.3 else rng.randrange(cfg.depth)
        writer.put({"addr": addr, "data": rng.choice((rng.randint(0, top), 0, top))})
    for req, _ in ports:
        for _ in range(n):
            req.put({"addr": rng.choice(hot) if rng.random() < 0.3 else rng.randrange(cfg.depth)})
    for _, resp in ports:
        await resp.wait_for(n, timeout_cycles=30 * n + 1000)
    await ClockCycles(dut.clk, 10)
    writes = [(c, item["addr"], item["data"]) for c, item in writer.sent]
    mismatches, nonzero = [], 0
    for k, (req, resp) in enumerate(ports):
        assert len(resp.received) == n, f"port {k}: {len(resp.received)} responses for {n} requests"
        want = SramModel(cfg).replay(writes, [(c, item["addr"]) for c, item in req.sent])
        got = [data for _, data in resp.received]
        nonzero += sum(1 for w in want if w)
        mismatches += [f"port {k} #{i} addr {req.sent[i][1]['addr']}: rtl {g} model {w}"
                       for i, (g, w) in enumerate(zip(got, want)) if g != w]
    ctx.report.update(vectors=n * cfg.read_ports, writes=len(writes), mismatches=len(mismatches),
                      nonzero_outputs=nonzero)
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:5]}"
