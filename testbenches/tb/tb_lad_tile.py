"""cocotb: LAD tile == golden.lad_tile.LadTileModel on every step's output beats and statistics,
with a KV memory model (random latency, request back-pressure, response gaps) and random
gaps/back-pressure on the step and output streams. Sequences are random (``kind``: drifting
queries over keys along a few directions, the zero interval, every position active) or
real SmolLM2 q/k/v (``trace``: a file of several heads, one sequence each). Every beat's ``cycles``
statistic of a LAD step is checked against its definition (docs/lad-tile.md, "Cycles"), counted
here from the ports: the cycles since the previous step's last ``o`` beat, less those in which the
tile waited for ``step_in`` (ready without valid) or for ``out`` (valid without ready); an exact
pass's (the dense baseline's own) at least ``golden.dense.dense_step_cycles``; BEYOND's 0.

A tile per KV group (``group`` g > 1): g query heads' models (one each, the same keys), every head's
o beats and statistics in head order; a LAD step's ``kv_beats`` (the group's KV port, reads shared
by the heads that need them at once) at least the busiest head's and at most the heads' sum."""
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
    cfg, g = bench.cfg, bench.cfg.group
    q, k, v = sequence(bench)
    qs = q if g > 1 else q[None]
    steps, nb = qs.shape[1], cfg.beats
    per_step = g * nb   # o beats of a step
    src, sink = bench.source("step_in", step_layout(cfg)), bench.sink("out", tile_out_layout(cfg))
    memory = bench.memory("kv_req", tile_kv_request_layout(cfg), "kv_resp", beat_layout(cfg), kv_lookup(k, v, cfg.lanes),
                          latency=(1, 6))
    models = [LadTileModel(cfg) for _ in range(g)]
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
            count = 0 if took and taken % per_step == 0 else count + (not waited)
            await RisingEdge(dut.clk)
    cocotb.start_soon(count_cycles())
    stats, head_stats = [], []   # head 0's statistics per step, and every head's
    for i in range(steps):
        # head h's q in the step's transfers h * nb ..; k_n and v_n read with head 0's (the others carry them too)
        src.put(*({"q": qb, "k": kb, "v": vb} for h in range(g)
                  for qb, kb, vb in zip(beats(qs[h][i], cfg), beats(k[i], cfg), beats(v[i], cfg))))
        outs = [model.step(qs[h][i], k[i], v[i]) for h, model in enumerate(models)]
        stats.append(outs[0][1])
        head_stats.append([st for _, st in outs])
        for h, (o, st) in enumerate(outs):
            # a group's LAD step: kv_beats is the shared port's, checked below
            fields = [key for key in STAT_FIELDS if g == 1 or key != "kv_beats" or st["path"] != StepPath.LAD]
            for b, ob in enumerate(beats(o, cfg)):
                sink.expect({"o": ob, **{key: st[key] for key in fields}, **({"head": h} if g > 1 else {})},
                            inputs=f"step {i} head {h} beat {b}")
    await bench.drain(timeout_cycles=sum(st["candidates"] * 8 + st["position"] * 12 + 3000 for st in stats) * 4 * g)
    bench.check("o beats seen by the cycle count", len(want_cycles), len(sink.received))
    for j, ((_, got), counted) in enumerate(zip(sink.received, want_cycles)):
        st, where = stats[j // per_step], f"step {j // per_step} beat {j % per_step}"
        if st["path"] == StepPath.LAD:
            bench.check("cycles", got["cycles"], counted, where)
        elif st["path"] == StepPath.EXACT:   # the dense baseline's own statistic: its schedule, or more when stalled
            floor = dense_step_cycles(cfg.fallback(), st["position"] + 1)
            bench.check(f"cycles at least the exact pass's {floor}", got["cycles"] >= floor, True, where)
        else:
            bench.check("cycles (BEYOND: none)", got["cycles"], 0, where)
    kv_beats = [got["kv_beats"] for _, got in sink.received[::per_step]]
    for i, (got, sts) in enumerate(zip(kv_beats, head_stats)):
        if g > 1 and sts[0]["path"] == StepPath.LAD:
            lo, hi = max(st["kv_beats"] for st in sts), sum(st["kv_beats"] for st in sts)
            bench.check(f"step {i} kv_beats within [{lo}, {hi}]", lo <= got <= hi, True)
    sum_of = lambda key: sum(st.get(key, 0) for sts in head_stats for st in sts)  # noqa: E731
    lad = [i for i, st in enumerate(stats) if st["path"] == StepPath.LAD]
    bench.finish(
        vectors=steps, steps=steps, beats=len(sink.expected), kv_requests=len(memory.requests.received),
        step_cycles=[got["cycles"] for _, got in sink.received[::per_step]],
        kv_beats=kv_beats,
        # a group's LAD steps: the heads' own KV beats summed, and the busiest head's (the union lies between)
        head_kv_beats_sum=sum(sum(st["kv_beats"] for st in head_stats[i]) for i in lad),
        head_kv_beats_max=sum(max(st["kv_beats"] for st in head_stats[i]) for i in lad),
        group_kv_beats=sum(kv_beats[i] for i in lad),
        candidates=sum_of("candidates"), active=sum_of("active"), false_alarms=sum_of("false_alarms"),
        mode_changes=sum_of("mode_changes"), centers=stats[-1]["centers"],
        paths=[int(st["path"]) for st in stats],
        new_centers=sum_of("new_center"), nonzero_outputs=sum(1 for w, _ in sink.expected if any(w["o"])),
        positions=[st["position"] for st in stats])
