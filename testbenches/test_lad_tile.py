"""LAD tile under Verilator vs the bit-accurate model golden.lad_tile (every output beat and
every step's statistics), on random sequences with corner cases and on real SmolLM2 heads;
and the bit-accurate model vs its float twin golden.lad_ref (docs/lad-tile.md, "Numerics")."""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from golden.errors import ConfigError
from golden.lad_ref import LadHead
from golden.lad_tile import PRESETS, LadTileConfig, LadTileModel, StepPath
from testbenches.runner import simulate

SEED = 2025
TRACE = Path(__file__).parent / "data" / "smollm2_lad_trace.pt"
GROUP_TRACE = Path(__file__).parent / "data" / "smollm2_group_trace.pt"   # one KV group: layer 9, query heads 3-5
SMALL = PRESETS["small"]   # d = 32, 4 beats, 2 AC VPUs, 64 positions (68 in the KV memory), 8 centers
# The group tile's two tests share one build: the defaults (d = 64, a group of 3, 8-bit compact
# centers, PWL cutoff -6) at 16 positions (20 in the KV memory) and 8 centers
GROUP = replace(PRESETS["default"], max_positions=16, max_centers=8, kv_positions=20)
ONE_HEAD = replace(PRESETS["default"], group=1)   # the default tile's format for one query head


def test_lad_tile_rtl_equals_golden_drift_past_the_end():
    """Keys along a few directions, drifting queries: approximations, candidates, false alarms,
    mode changes and counter halving; the 8-entry center table fills (later keys join their best
    center); past max_positions = 64 the exact pass (steps 64-67, the dense baseline over the KV
    memory), past kv_positions = 68 no output. (Compact centers: the group tile's tests below.)"""
    r = simulate("lad-tile", SMALL, "testbenches.tb.tb_lad_tile", seed=SEED, name="drift",
                 params={"steps": 70, "kind": "drift"})
    assert r["mismatches"] == 0 and r["steps"] == 70
    assert r["positions"][0] == 0 and r["positions"][-1] == 68
    assert r["paths"] == [StepPath.LAD] * 64 + [StepPath.EXACT] * 4 + [StepPath.BEYOND] * 2
    assert all(beats == 2 * (n + 1) * SMALL.beats for n, beats in zip(r["positions"][64:68], r["kv_beats"][64:68]))
    assert r["centers"] == SMALL.max_centers
    assert r["candidates"] > r["active"] > 0 and r["mode_changes"] > 0 and r["false_alarms"] > 0
    assert r["nonzero_outputs"] > r["beats"] // 2
    assert r["kv_requests"] == sum(r["kv_beats"])          # the tile reads only what it reports


@pytest.mark.parametrize("kind, steps", [("all_active", 30), ("zero_interval", 24)])
def test_lad_tile_rtl_equals_golden_corner_sequences(kind, steps):
    r = simulate("lad-tile", SMALL, "testbenches.tb.tb_lad_tile", seed=SEED + 1, name=kind,
                 params={"steps": steps, "kind": kind, "latency": [1, 10], "gap": 0.5, "stall": 0.5})
    assert r["mismatches"] == 0 and r["steps"] == steps
    assert r["nonzero_outputs"] > 0
    if kind == "all_active":   # unrelated queries: most absorbed positions change interval every step
        assert r["active"] > 0.5 * sum(r["positions"])
    else:                      # one dominant key: everything else sits in the zero interval, quiet
        assert r["active"] < 0.1 * sum(r["positions"])


def test_lad_tile_rtl_equals_golden_fpga_structure():
    """The structure of the ``ecp5-85f`` preset at the small shape: one AC VPU, EAS a quarter of a
    center a cycle, AC's scalar arithmetic one lane a cycle (``ac_lanes = 1``), no exact pass
    (``kv_positions = max_positions``: past it every step is BEYOND, and no dense baseline is
    built); every position active, random latency, gaps and back-pressure."""
    cfg = replace(SMALL, vpus=4, eas_beats=4, ac_lanes=1, max_positions=16, kv_positions=16)
    r = simulate("lad-tile", cfg, "testbenches.tb.tb_lad_tile", seed=SEED + 2, name="fpga",
                 params={"steps": 20, "kind": "all_active", "latency": [1, 10], "gap": 0.5, "stall": 0.5})
    assert r["mismatches"] == 0 and r["steps"] == 20
    assert r["paths"] == [StepPath.LAD] * 16 + [StepPath.BEYOND] * 4
    assert r["active"] > 0.5 * sum(r["positions"][:16]) and r["mode_changes"] > 0
    assert r["nonzero_outputs"] > r["beats"] // 2


def test_lad_tile_rtl_equals_golden_on_real_smollm2_head():
    """A real decode sequence (SmolLM2 layer 12, head 4; benchmarks/record_lad_trace.py) at the
    default config for one head, shortened to keep the suite fast (the benchmark runs it longer)."""
    cfg = ONE_HEAD
    r = simulate("lad-tile", cfg, "testbenches.tb.tb_lad_tile", seed=SEED, name="trace",
                 params={"trace": str(TRACE), "head": 1, "steps": 32, "latency": [1, 4]})
    assert r["mismatches"] == 0 and r["steps"] == 32
    assert r["active"] > 0 and r["candidates"] > 0 and r["centers"] > 8
    assert r["nonzero_outputs"] == r["beats"]


def test_lad_tile_group_rtl_equals_golden_drift_past_the_end():
    """A tile per KV group (``group`` 3): three query heads' drifting queries against one key
    sequence, each head's o and statistics bit-exact with its own model; one center table (filling),
    each head's candidates on the group's one KV port (reads shared where heads need them at once:
    fewer than the heads' own in all, at least the busiest head's at every step); past
    max_positions (16) the group-aware exact pass, past kv_positions (20) BEYOND for every head."""
    r = simulate("lad-tile", GROUP, "testbenches.tb.tb_lad_tile", seed=SEED + 3, name="group-drift",
                 params={"steps": 22, "kind": "drift"})
    assert r["mismatches"] == 0 and r["steps"] == 22 and r["beats"] == 22 * 3 * GROUP.beats
    assert r["paths"] == [StepPath.LAD] * 16 + [StepPath.EXACT] * 4 + [StepPath.BEYOND] * 2
    assert all(beats == 2 * (n + 1) * GROUP.beats for n, beats in zip(r["positions"][16:20], r["kv_beats"][16:20]))
    assert r["head_kv_beats_max"] <= r["group_kv_beats"] < r["head_kv_beats_sum"]
    assert r["active"] > 0 and r["mode_changes"] > 0 and r["centers"] == GROUP.max_centers


def test_lad_tile_group_rtl_equals_golden_on_a_real_smollm2_kv_group():
    """A real KV group (SmolLM2 layer 9, query heads 3-5) in the group tile above (its 8-entry center
    table fills on the real keys), random latency."""
    r = simulate("lad-tile", GROUP, "testbenches.tb.tb_lad_tile", seed=SEED + 4, name="group-trace",
                 params={"trace": str(GROUP_TRACE), "steps": 16, "latency": [1, 4]})
    assert r["mismatches"] == 0 and r["steps"] == 16 and r["paths"] == [StepPath.LAD] * 16
    assert r["active"] > 0 and r["candidates"] > 0 and r["centers"] == GROUP.max_centers
    assert r["nonzero_outputs"] == r["beats"]
    assert r["head_kv_beats_max"] <= r["group_kv_beats"] < r["head_kv_beats_sum"]


def test_bit_accurate_within_bound_of_float_on_real_heads():
    """Stated bound (docs/lad-tile.md): |o_bits - o_float| <= 0.05 max|v| per step; decisions
    (candidates) may differ only where a score sits within rounding of a boundary."""
    cfg = ONE_HEAD
    t = torch.load(TRACE)
    f = cfg.kv_format
    worst, decisions, total = 0.0, 0, 0
    for h in range(t["q"].shape[0]):
        q, k, v = (f.quantize(t[name][h, :256].float()) for name in ("q", "k", "v"))
        bits, ref = LadTileModel(cfg), LadHead(cfg.reference())
        vmax = float(f.to_float(v).abs().max())
        for i in range(q.shape[0]):
            o, st = bits.step(q[i], k[i], v[i])
            of, sf = ref.step(f.to_float(q[i]), f.to_float(k[i]), f.to_float(v[i]))
            worst = max(worst, float((f.to_float(o) - of).abs().max()) / vmax)
            decisions += abs(st["candidates"] - sf["candidates"])
            total += st["position"]
            assert st["centers"] == sf["centers"] or i > 0
    assert worst <= 0.05, worst
    assert worst > 1e-4                     # the bound is not vacuous: the models differ
    assert decisions < 0.01 * total


def test_golden_cache_invariant():
    """Caches B..F equal the sums over absorbed positions of their mode coefficients (§1.2);
    A within the rounding of g = alpha v (half an LSB times |k| per update)."""
    cfg = SMALL
    g = torch.Generator().manual_seed(SEED)
    f = cfg.kv_format
    model = LadTileModel(cfg)
    changes = 0
    for _ in range(40):
        q, k, v = (f.quantize(torch.randn(cfg.head_dim, generator=g) * 2) for _ in range(3))
        changes += model.step(q, k, v)[1]["mode_changes"]
    n = model.n
    a, b = model.slopes[model.mode[:n]], model.intercepts[model.mode[:n]]
    K, V = model.K[:n], model.V[:n]
    assert torch.equal(model.B, (a[:, None] * V).sum(0)) and torch.equal(model.D, (a[:, None] * K).sum(0))
    assert torch.equal(model.C, (b[:, None] * V).sum(0)) and model.E == int(a.sum()) and model.F == int(b.sum())
    g_rows = (a[:, None] * V + 128) >> 8
    err = (model.A - (g_rows[:, :, None] * K[:, None, :]).sum(0)).abs().max()
    assert changes > 0 and err <= changes * K.abs().max()
    assert int(model.counters[:n].max()) <= cfg.counter_max and int(model.counters[:n].sum()) > n


def test_lad_tile_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="vpus"):
        LadTileConfig(vpus=3)
    with pytest.raises(ConfigError, match="multiple of the AC VPUs"):
        LadTileConfig(vpus=6)
    with pytest.raises(ConfigError, match="max_centers"):
        LadTileConfig(max_centers=0)
    with pytest.raises(ConfigError, match="kv_frac"):
        LadTileConfig(kv_frac=10)
