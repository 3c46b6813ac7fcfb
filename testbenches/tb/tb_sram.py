"""cocotb: SRAM bank == golden.sram.SramModel: random writes and reads on every port at
once, replayed in cycle order (reads see writes of earlier cycles), with random gaps on
the write and request streams and random back-pressure on every response stream; each port's
fewest cycles from request to response is the configured read_latency."""
from __future__ import annotations

import cocotb
from amaranth import unsigned

from golden.sram import SramConfig, SramModel
from hdl.lib.sram import sram_read_layout, sram_write_layout
from testbenches.streams import Bench


@cocotb.test()
async def sram_matches_model(dut):
    bench = await Bench.start(dut, SramConfig)
    cfg, rng = bench.cfg, bench.rng
    n = bench.vectors(1000)
    writer = bench.source("write", sram_write_layout(cfg))
    ports = [(bench.source(f"read{k}_req", sram_read_layout(cfg)), bench.sink(f"read{k}_resp", unsigned(cfg.width)))
             for k in range(cfg.read_ports)]
    hot = [0, cfg.depth - 1, rng.randrange(cfg.depth)]  # corner addresses, reused to collide
    top = (1 << cfg.width) - 1
    for _ in range(n):
        addr = rng.choice(hot) if rng.random() < 0.3 else rng.randrange(cfg.depth)
        writer.put({"addr": addr, "data": rng.choice((rng.randint(0, top), 0, top))})
    for req, _ in ports:
        req.put(*({"addr": rng.choice(hot) if rng.random() < 0.3 else rng.randrange(cfg.depth)} for _ in range(n)))
    for _, resp in ports:
        await resp.wait_for(n, timeout_cycles=30 * n + 1000)
    await bench.settle(10)
    # the golden model replays the writes and reads in the cycles they were accepted
    writes = [(c, item["addr"], item["data"]) for c, item in writer.sent]
    nonzero = 0
    for k, (req, resp) in enumerate(ports):
        want = SramModel(cfg).replay(writes, [(c, item["addr"]) for c, item in req.sent])
        nonzero += sum(1 for w in want if w)
        bench.compare(f"port {k}", resp.items, want, inputs=[f"addr {item['addr']}" for item in req.items])
        # read_latency is a contract: no response sooner after its request, and exactly that when
        # nothing stalls it (some response of the run is unstalled)
        latencies = [got_at - asked_at for (asked_at, _), (got_at, _) in zip(req.sent, resp.received)]
        bench.check(f"port {k} read latency (fewest cycles)", min(latencies), cfg.read_latency)
    bench.finish(vectors=n * cfg.read_ports, writes=len(writes), nonzero_outputs=nonzero)
