"""cocotb: LAD tile == golden.lad_tile.LadTileModel on every step's output beats and statistics,
with a KV memory model (random latency, request back-pressure, response gaps) and random
gaps/back-pressure on the step and output streams. Sequences are random (``kind``: drifting
queries over keys along a few directions, the zero interval, every position active) or
real SmolLM2 q/k/v (``trace``: a file of several heads, one sequence each). Every beat's ``cycles``
statistic of a LAD step is checked against its definition (docs/lad-tile.md, "Cycles"), counted
here from the ports: the cycles since the previous step's last ``o`` beat, less those in which the
tile waited for ``step_in`` (ready without valid) or for ``out`` (valid without ready); an exact
pass's (the dense baseline's own) at least ``golden.dense.dense_step_cycles``; BEYOND's 0."""
from __future__ import annotations

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from golden.dense import dense_step_cycles
from golden.lad_tile import LadTileConfig, LadTileModel, StepPath
from hdl.lad.common import beat_layout
from hdl.lad.tile import step_layout, tile_kv_request_layout, tile_out_layout
from testbenches.streams import Bench, kv_lookup
from testbenches.tb.lad_steps import beats, sequence

STAT_FIELDS = ("position", "candidates", "active", "false_alarms", "mode_changes", "centers", "new_center",
               "path", "m", "z", "kv_beats")


@cocotb.test()
async def lad_tile_matches_golden(dut):
    bench = await Bench.start(dut, LadTileConfig)
    cfg = bench.cfg
    q, k, v = sequence(bench)
    steps, nb = q.shape[0], cfg.beats
    src, sink = bench.source("step_in", step_layout(cfg)), bench.sink("out", tile_out_layout(cfg))
    memory = bench.memory("kv_req", tile_kv_request_layout(cfg), "kv_resp", beat_layout(cfg), kv_lookup(k, v, cfg.lanes),
                          latency=(1, 6))
    model = LadTileModel(cfg)
    want_cycles = []   # each o beat's cycles statistic, counted from the ports

    async def count_cycles():
        count = taken = 0
        while True:
            await ReadOnly()
            out_valid, out_ready = int(sink.valid.value), int(sink.ready.value)
            waited = (out_valid and not out_ready) or (int(src.ready.value) and not int(src.valid.value))
            took = out_valid and out_ready
            if took:
                want_cycles.append(count)
                taken += 1
            count = 0 if took and taken % nb == 0 else count + (not waited)
            await RisingEdge(dut.clk)
    cocotb.start_soon(count_cycles())
    stats = []
    for i in range(steps):
        src.put(*({"q": qb, "k": kb, "v": vb} for qb, kb, vb in zip(beats(q[i], cfg), beats(k[i], cfg), beats(v[i], cfg))))
        o, st = model.step(q[i], k[i], v[i])
        stats.append(st)
        for b, ob in enumerate(beats(o, cfg)):
            sink.expect({"o": ob, **{key: st[key] for key in STAT_FIELDS}}, inputs=f"step {i} beat {b}")
    await bench.drain(timeout_cycles=sum(st["candidates"] * 8 + st["position"] * 12 + 3000 for st in stats) * 4)
    bench.check("o beats seen by the cycle count", len(want_cycles), len(sink.received))
    for j, ((_, got), counted) in enumerate(zip(sink.received, want_cycles)):
        st, where = stats[j // nb], f"step {j // nb} beat {j % nb}"
        if st["path"] == StepPath.LAD:
            bench.check("cycles", got["cycles"], counted, where)
        elif st["path"] == StepPath.EXACT:   # the dense baseline's own statistic: its schedule, or more when stalled
            floor = dense_step_cycles(cfg.fallback(), st["position"] + 1)
            bench.check(f"cycles at least the exact pass's {floor}", got["cycles"] >= floor, True, where)
        else:
            bench.check("cycles (BEYOND: none)", got["cycles"], 0, where)
    sum_of = lambda key: sum(st.get(key, 0) for st in stats)  # noqa: E731
    bench.finish(
        vectors=steps, steps=steps, beats=len(sink.expected), kv_requests=len(memory.requests.received),
        step_cycles=[got["cycles"] for _, got in sink.received[::nb]],
        kv_beats=[got["kv_beats"] for _, got in sink.received[::nb]],
        candidates=sum_of("candidates"), active=sum_of("active"), false_alarms=sum_of("false_alarms"),
        mode_changes=sum_of("mode_changes"), centers=stats[-1]["centers"],
        paths=[int(st["path"]) for st in stats],
        new_centers=sum_of("new_center"), nonzero_outputs=sum(1 for w, _ in sink.expected if any(w["o"])),
        positions=[st["position"] for st in stats])
