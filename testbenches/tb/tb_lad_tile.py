"""cocotb: LAD tile == golden.lad_tile.LadTileModel on every step's output beats and statistics,
with a KV memory model (random latency, request back-pressure, response gaps) and random
gaps/back-pressure on the step and output streams. Sequences are random (``kind``: drifting
queries over keys along a few directions, the zero interval, every position active) or
real SmolLM2 q/k/v (``trace``: a file of several heads, one sequence each)."""
from __future__ import annotations

import cocotb
import torch
from cocotb.triggers import ClockCycles

from golden.lad_tile import LadTileConfig, LadTileModel
from hdl.lad.common import beat_layout
from hdl.lad.dense import kv_request_layout
from hdl.lad.tile import step_layout, tile_out_layout
from testbenches.streams import Context, StreamMemory, StreamSink, StreamSource, start

STAT_FIELDS = ("position", "candidates", "active", "false_alarms", "mode_changes", "centers", "new_center",
               "overflow", "m", "z", "kv_beats")


def random_sequence(cfg: LadTileConfig, seed: int, steps: int, kind: str):
    """Raw (steps, d) q, k, v of one synthetic head."""
    gen = torch.Generator().manual_seed(seed)
    d, f = cfg.head_dim, cfg.kv_format
    if kind == "zero_interval":     # one dominant key: every other position far below the cutoff
        k = torch.randn(steps, d, generator=gen) * 0.05
        q = torch.randn(d, generator=gen).expand(steps, d) * 3.0
        k[0] = q[0] * 1.0
        v = torch.randn(steps, d, generator=gen)
    elif kind == "all_active":      # unrelated queries every step: intervals move all the time
        k = torch.randn(steps, d, generator=gen) * 1.5
        q = torch.randn(steps, d, generator=gen) * 4.0 * torch.where(torch.arange(steps) % 2 == 0, 1.0, -1.0)[:, None]
        v = torch.randn(steps, d, generator=gen) * 2.0
    else:                            # "drift": keys along few directions, slowly drifting queries
        base = torch.randn(6, d, generator=gen)
        k = base[torch.randint(0, 6, (steps,), generator=gen)] * torch.randn(steps, 1, generator=gen) \
            + 0.02 * torch.randn(steps, d, generator=gen)
        drift = torch.cumsum(torch.randn(steps, d, generator=gen) * 0.15, 0)
        q = 1.5 * torch.randn(d, generator=gen) + drift
        v = torch.randn(steps, d, generator=gen) * 2.0
        v[1] = 127.0                 # corner: extreme value rows
        k[2] = -100.0
    return f.quantize(q), f.quantize(k), f.quantize(v)


@cocotb.test()
async def lad_tile_matches_golden(dut):
    ctx = Context(LadTileConfig)
    cfg, rng, p = ctx.cfg, ctx.rng, ctx.params
    steps = p.get("steps", 24)
    if p.get("trace"):
        t = torch.load(p["trace"])
        h = p.get("head", 0)
        f = cfg.kv_format
        q, k, v = (f.quantize(t[name][h, :steps, :cfg.head_dim].float()) for name in ("q", "k", "v"))
    else:
        q, k, v = random_sequence(cfg, rng.randrange(1 << 30), steps, p.get("kind", "drift"))
    steps = q.shape[0]
    cycles = await start(dut)
    gap, stall = p.get("gap", 0.3), p.get("stall", 0.3)
    src = StreamSource(dut, "step_in", step_layout(cfg), cycles, rng, gap=gap)
    sink = StreamSink(dut, "out", tile_out_layout(cfg), cycles, rng, stall=stall)
    L, nb = cfg.lanes, cfg.beats

    def lookup(req):
        table = v if req["value"] else k
        return table[req["position"], req["beat"] * L:(req["beat"] + 1) * L].tolist()

    memory = StreamMemory(dut, "kv_req", kv_request_layout(cfg), "kv_resp", beat_layout(cfg), cycles, rng,
                          lookup, latency=tuple(p.get("latency", (1, 6))), stall=stall, gap=gap)
    model = LadTileModel(cfg)
    want, stats = [], []
    for i in range(steps):
        for b in range(nb):
            sl = slice(b * L, (b + 1) * L)
            src.put({"q": q[i, sl].tolist(), "k": k[i, sl].tolist(), "v": v[i, sl].tolist()})
        o, st = model.step(q[i], k[i], v[i])
        stats.append(st)
        for b in range(nb):
            want.append({"o": o[b * L:(b + 1) * L].tolist(), **{key: st[key] for key in STAT_FIELDS}})
    budget = sum(st["candidates"] * 8 + st["position"] * 12 + 3000 for st in stats) * 4
    await sink.wait_for(len(want), timeout_cycles=budget)
    await ClockCycles(dut.clk, 20)
    assert len(sink.received) == len(want)
    mismatches = []
    for n, ((_, got), w) in enumerate(zip(sink.received, want)):
        got_cmp = {key: got[key] for key in w}
        if got_cmp != w:
            diff = {key: (got_cmp[key], w[key]) for key in w if got_cmp[key] != w[key]}
            mismatches.append(f"step {n // nb} beat {n % nb}: (rtl, golden) {diff}")
    sum_of = lambda key: sum(st.get(key, 0) for st in stats)  # noqa: E731
    ctx.report.update(
        steps=steps, beats=len(want), mismatches=len(mismatches),
        kv_requests=len(memory.requests.received),
        step_cycles=[got["cycles"] for _, got in sink.received[::nb]],
        kv_beats=[got["kv_beats"] for _, got in sink.received[::nb]],
        candidates=sum_of("candidates"), active=sum_of("active"), false_alarms=sum_of("false_alarms"),
        mode_changes=sum_of("mode_changes"), overflow=sum_of("overflow"), centers=stats[-1]["centers"],
        new_centers=sum_of("new_center"), nonzero_outputs=sum(1 for w in want if any(w["o"])),
        positions=[st["position"] for st in stats])
    ctx.write_report()
    assert not mismatches, f"seed {ctx.seed}: {len(mismatches)} mismatches, first: {mismatches[:3]}"
