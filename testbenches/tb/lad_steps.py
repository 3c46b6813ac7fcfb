"""Shared by the per-module LAD benches (tb_lad_eas/apid/md/ac): a step sequence (random kind of
tb_lad_tile, or a real SmolLM2 head) run through golden.lad_tile.LadTileModel with its trace
on, giving per step the transactions each module sees and produces (the bench plays the tile
sequencer and the neighbouring modules from them)."""
from __future__ import annotations

import torch

from golden.lad_tile import LadTileConfig, LadTileModel
from testbenches.streams import Context, start
from testbenches.tb.tb_lad_tile import random_sequence


def eas_corners(cfg: LadTileConfig, k: torch.Tensor, rng) -> torch.Tensor:
    """EAS corner keys on the first steps and one late step: a tiny first center, a zero key
    (|k|^2 = 0 becomes a center, RECIP(0)), keys along the tiny center 200x longer in both
    signs (rho saturates at +-max), its negation (rho = -1), and a zero key once the table
    may be full (joins with rho = 0)."""
    k = k.clone()
    d, steps = cfg.head_dim, k.shape[0]
    tiny = torch.tensor([rng.choice((-1, 1)) for _ in range(d)], dtype=torch.int64)
    rows = [tiny, torch.zeros(d, dtype=torch.int64), 200 * tiny, -200 * tiny, -tiny]
    for i, row in enumerate(rows[:steps]):
        k[i] = row
    if steps > 3 * cfg.max_centers:
        k[steps - 3] = 0
    return k


def sequence(cfg: LadTileConfig, rng, params: dict):
    """Raw (steps, d) q, k, v: ``trace`` (a SmolLM2 head), else ``kind`` of tb_lad_tile's
    random_sequence; ``eas_corners`` puts the EAS corner keys in."""
    steps = params.get("steps", 24)
    if params.get("trace"):
        t = torch.load(params["trace"])
        h, f = params.get("head", 0), cfg.kv_format
        q, k, v = (f.quantize(t[name][h, :steps, :cfg.head_dim].float()) for name in ("q", "k", "v"))
    else:
        q, k, v = random_sequence(cfg, rng.randrange(1 << 30), steps, params.get("kind", "drift"))
    if params.get("eas_corners"):
        k = eas_corners(cfg, k, rng)
    return q, k, v


def golden_records(cfg: LadTileConfig, q, k, v) -> tuple[LadTileModel, list[dict]]:
    """The model after the sequence, and one trace record per (non-overflow) step."""
    trace: list[dict] = []
    model = LadTileModel(cfg, trace=trace)
    for i in range(q.shape[0]):
        model.step(q[i], k[i], v[i])
    return model, [r for r in trace if not r["overflow"]]


def beats(vec, cfg: LadTileConfig) -> list[list[int]]:
    """A d-vector as its ``beats`` transfers of ``lanes`` elements."""
    vec = list(vec)
    return [vec[b * cfg.lanes:(b + 1) * cfg.lanes] for b in range(cfg.beats)]


async def open_bench(dut):
    """The common opening of a module bench: its context (config, seed, parameters), the step
    sequence run through the golden model with its trace on, clock and reset, and the bench's
    gap and stall probabilities. Returns ``ctx, (q, k, v), model, records, cycles, (gap, stall)``."""
    ctx = Context(LadTileConfig)
    q, k, v = sequence(ctx.cfg, ctx.rng, ctx.params)
    model, recs = golden_records(ctx.cfg, q, k, v)
    cycles = await start(dut)
    return ctx, (q, k, v), model, recs, cycles, (ctx.params.get("gap", 0.3), ctx.params.get("stall", 0.3))
