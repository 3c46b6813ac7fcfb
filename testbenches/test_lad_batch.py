"""golden.lad_batch.LadTileBatch (H heads as tensors) == H independent golden.lad_tile.LadTileModels:
every step's o and statistics and the final state, on a real SmolLM2 trace at the default
config, on random sequences at the small preset (full center table, zero keys, extreme values,
the exact pass past max_positions), on a narrow-cache variant where N, Z and the caches saturate, and
on all-active / zero-interval corners. No Verilator."""
import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from golden.dense import dense_attention_bits
from golden.fixedpoint import round_shift
from golden.lad_batch import LadTileBatch, mul_wide, round_shift_wide
from golden.lad_tile import PRESETS, LadTileConfig, LadTileModel, StepPath, center_value, compact_center
from golden.sfm import exp_pwl, recip

TRACE = Path(__file__).parent / "data" / "smollm2_lad_trace.pt"
SMALL = PRESETS["small"]   # d = 32, 64 positions, 8 centers
SEEDS = (2025, 2026, 2027, 2028)
GROUP_KEYS = {"group_candidates", "group_active"}   # the batch's alone: unions over a group's heads


@dataclass(frozen=True)
class NarrowCacheConfig(LadTileConfig):
    """The small tile with narrow AC registers, so that N, Z and the caches A..F saturate
    (at the real widths they cannot within 64 positions)."""
    ac_operand_width = 12
    ac_acc_width = 28
    ef_width = 18

    @property
    def z_width(self) -> int:
        return 21


def small_with(cls=LadTileConfig, **kw) -> LadTileConfig:
    fields = {f.name: getattr(SMALL, f.name) for f in dataclasses.fields(LadTileConfig)}
    return cls(**{**fields, **kw})


def random_heads(cfg: LadTileConfig, seed: int, heads: int, steps: int, kind: str = "drift"):
    """Raw (heads, steps, d) q, k, v; ``drift``: keys along a few directions with drifting
    queries, plus corner rows (zero keys early and late, a tiny key and it 200x longer in both
    signs: rho saturates, extreme q, k, v rows: scores and x saturate); ``all_active``: unrelated
    queries of alternating sign; ``zero_interval``: one dominant key."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    d, f = cfg.head_dim, cfg.kv_format
    qs, ks, vs = [], [], []
    for _ in range(heads):
        if kind == "all_active":
            k = torch.randn(steps, d, generator=gen) * 1.5
            sign = torch.where(torch.arange(steps) % 2 == 0, 1.0, -1.0)[:, None]
            q = torch.randn(steps, d, generator=gen) * 4.0 * sign
            v = torch.randn(steps, d, generator=gen) * 2.0
        elif kind == "zero_interval":
            k = torch.randn(steps, d, generator=gen) * 0.05
            q = (torch.randn(d, generator=gen) * 3.0).expand(steps, d).clone()
            k[0] = q[0]
            v = torch.randn(steps, d, generator=gen)
        else:
            base = torch.randn(6, d, generator=gen)
            k = base[torch.randint(0, 6, (steps,), generator=gen)] * torch.randn(steps, 1, generator=gen) \
                + 0.02 * torch.randn(steps, d, generator=gen)
            q = 1.5 * torch.randn(d, generator=gen) + torch.cumsum(torch.randn(steps, d, generator=gen) * 0.15, 0)
            v = torch.randn(steps, d, generator=gen) * 2.0
        q, k, v = f.quantize(q), f.quantize(k), f.quantize(v)
        if kind == "drift":
            tiny = torch.tensor([rng.choice((-1, 1)) for _ in range(d)], dtype=torch.int64)
            for i, row in enumerate([tiny, torch.zeros(d, dtype=torch.int64), 200 * tiny, -200 * tiny, -tiny]):
                k[i] = row
            k[steps // 2] = 0                                  # zero key once the table is full
            hot = rng.sample(range(5, steps), 6)
            v[hot[0]] = f.max_raw
            v[hot[1]] = f.min_raw
            k[hot[2]] = f.min_raw
            q[hot[3]] = f.max_raw
            q[hot[4]] = -q[hot[4] - 1]
            k[hot[5]], v[hot[5]] = f.max_raw, f.max_raw
        qs.append(q)
        ks.append(k)
        vs.append(v)
    return torch.stack(qs), torch.stack(ks), torch.stack(vs)


def run_both(cfg: LadTileConfig, q, k, v):
    """Step the batch and per-head models; assert identical o and statistics on every step and the
    same final state. Returns (batch, per-head models, per-step stats of the batch, outputs)."""
    H, steps, g = q.shape[0], q.shape[1], cfg.group
    batch = LadTileBatch(cfg, H)
    tiles = [LadTileModel(cfg, trace=[] if g > 1 else None) for _ in range(H)]
    stats, outs = [], []
    for i in range(steps):
        o, st = batch.step(q[:, i], k[:, i], v[:, i])
        assert o.shape == (H, cfg.head_dim) and o.dtype == torch.int64
        union = [[set(), set()] for _ in range(H // g)]     # a group's candidates, actives (from the traces)
        for h, tile in enumerate(tiles):
            oh, sh = tile.step(q[h, i], k[h, i], v[h, i])
            assert torch.equal(o[h], oh), f"step {i} head {h}: o differs"
            assert set(st) == set(sh) | GROUP_KEYS, "stat keys differ"
            for key, val in sh.items():
                assert int(st[key][h]) == val, f"step {i} head {h}: {key} {int(st[key][h])} != {val}"
            if g == 1:
                assert int(st["group_candidates"][h]) == sh["candidates"] and \
                    int(st["group_active"][h]) == sh["active"]
            elif sh["path"] == StepPath.LAD:
                tr = tile.trace[-1]
                union[h // g][0] |= set(tr.cand)
                union[h // g][1] |= {c for c, md in zip(tr.cand, tr.md) if md.active}
        for h in range(H if g > 1 else 0):
            assert int(st["group_candidates"][h]) == len(union[h // g][0]), f"step {i} head {h}: group candidates"
            assert int(st["group_active"][h]) == len(union[h // g][1]), f"step {i} head {h}: group actives"
        stats.append(st)
        outs.append(o)
    assert batch.n == tiles[0].n
    n = batch.n
    for h, tile in enumerate(tiles):
        assert int(batch.n_centers[h]) == tile.n_centers
        assert torch.equal(batch.A[h], tile.A) and torch.equal(batch.B[h], tile.B)
        assert torch.equal(batch.C[h], tile.C) and torch.equal(batch.D[h], tile.D)
        assert int(batch.E[h]) == tile.E and int(batch.F[h]) == tile.F
        assert torch.equal(batch.mode[h, :n], tile.mode[:n]) and torch.equal(batch.rho[h, :n], tile.rho[:n])
        assert torch.equal(batch.counters[h, :n].long(), tile.counters[:n])
        assert torch.equal(batch.center_of[h, :n], tile.center_of[:n])
    return batch, tiles, stats, torch.stack(outs, 1)


def total(stats, key):
    return sum(int(st[key].sum()) for st in stats)


def test_wide_products_equal_python_ints():
    """mul_wide + round_shift_wide == round_shift of the exact product (clamped to +-2**62), at
    random magnitudes, both signs and extreme operands."""
    g = torch.Generator().manual_seed(SEEDS[0])
    a = torch.randint(-(1 << 61), 1 << 61, (4000,), generator=g) >> torch.randint(0, 62, (4000,), generator=g)
    b = torch.randint(-(1 << 30), 1 << 30, (4000,), generator=g) >> torch.randint(0, 31, (4000,), generator=g)
    a[:4] = torch.tensor([(1 << 61) - 1, -(1 << 61), -(1 << 61), 0])
    b[:4] = torch.tensor([(1 << 30) - 1, -(1 << 30), (1 << 30) - 1, 5])
    s = torch.randint(0, 80, (4000,), generator=g)
    clamp = lambda x: max(-(1 << 62), min(1 << 62, x))   # noqa: E731
    out = round_shift_wide(*mul_wide(a, b), s).tolist()
    want = [clamp(round_shift(x * y, z)) for x, y, z in zip(a.tolist(), b.tolist(), s.tolist())]
    assert out == want
    for shift in (0, 1, 11, 13, 30, 31, 32, 47):
        assert round_shift_wide(*mul_wide(a, b), shift).tolist() == \
            [clamp(round_shift(x * y, shift)) for x, y in zip(a.tolist(), b.tolist())]


def test_local_sfm_tables_equal_golden_sfm():
    cfg = PRESETS["default"]
    batch = LadTileBatch(cfg, cfg.group)
    w = cfg.sfm.recip_in_width
    z = torch.cat([torch.tensor([0, 1, 2, 3, (1 << w) - 1]), 1 << torch.arange(w),
                   torch.randint(0, 1 << w, (3000,), generator=torch.Generator().manual_seed(SEEDS[1]))])
    for mine, ref in zip(batch._recip(z), recip(z, cfg.sfm)):
        assert torch.equal(mine, ref)
    x = torch.arange(cfg.sfm.x_format.min_raw, cfg.sfm.x_format.max_raw + 1)
    for mine, ref in zip(batch._exp(x), exp_pwl(x, cfg.sfm)):
        assert torch.equal(mine, ref)


def test_batch_equals_per_head_models_on_real_smollm2_heads():
    """3 real heads (SmolLM2 layers 3, 12, 25; benchmarks/record_lad_trace.py), 320 steps, the default
    config for one head each (heads of different layers are no KV group)."""
    cfg = dataclasses.replace(PRESETS["default"], group=1)
    t = torch.load(TRACE)
    f = cfg.kv_format
    q, k, v = (f.quantize(t[name][:, :320].float()) for name in ("q", "k", "v"))
    assert q.shape[0] >= 3
    _, _, stats, o = run_both(cfg, q, k, v)
    assert (o != 0).float().mean() > 0.9
    assert total(stats, "candidates") > total(stats, "active") > 0 and total(stats, "mode_changes") > 0
    assert total(stats, "false_alarms") > 0 and int(stats[-1]["centers"].min()) > 8


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_batch_equals_per_head_models_small_drift_overflow(seed):
    """4 heads, 72 steps at the small preset: the 8-entry table fills (later keys join), zero keys,
    rho saturation, extreme rows, counter halving; past 64 positions the exact pass (steps 64-67,
    the dense baseline over the whole KV memory), past kv_positions = 68 no output."""
    cfg = SMALL
    P, K = cfg.max_positions, cfg.kv_positions
    q, k, v = random_heads(cfg, seed, 4, 72)
    batch, tiles, stats, o = run_both(cfg, q, k, v)
    assert (o[:, :P] != 0).float().mean() > 0.5
    paths = torch.stack([st["path"] for st in stats], 1)                  # (heads, steps)
    assert bool((paths[:, :P] == StepPath.LAD).all()) and bool((paths[:, P:K] == StepPath.EXACT).all())
    assert bool((paths[:, K:] == StepPath.BEYOND).all())
    for h in range(4):
        for i in range(P, K):                                             # exact: the dense baseline's output
            ref, m, z = dense_attention_bits(q[h, i], k[h, :i + 1], v[h, :i + 1], cfg.fallback())
            assert torch.equal(o[h, i], ref) and int(stats[i]["m"][h]) == m and int(stats[i]["z"][h]) == z
    assert bool((o[:, P:K] != 0).any(-1).all())
    assert torch.equal(o[:, K:], torch.zeros_like(o[:, K:]))
    assert int(batch.n_centers.min()) == cfg.max_centers
    assert total(stats, "candidates") > total(stats, "active") > 0
    assert total(stats, "mode_changes") > 0 and total(stats, "false_alarms") > 0
    rho_max = cfg.rho_format.max_raw
    assert bool((batch.rho.abs() >= rho_max).any())                     # rho saturated
    assert any(int(st["m"].abs().max()) == cfg.sfm.x_format.max_raw for st in stats)   # scores saturated
    assert int(tiles[0].counters.max()) <= cfg.counter_max


def test_batch_equals_per_head_models_when_caches_saturate(monkeypatch):
    """Narrow AC registers: N, Z, A..F saturate (the per-head model's add-then-saturate order,
    which the batch follows on its exact path)."""
    import golden.lad_batch as lad_batch
    exact_calls = []
    seq = lad_batch.sat_add_sequence
    monkeypatch.setattr(lad_batch, "sat_add_sequence", lambda *a: exact_calls.append(1) or seq(*a))
    cfg = small_with(NarrowCacheConfig)
    q, k, v = random_heads(cfg, SEEDS[3], 3, 70)
    batch, tiles, stats, o = run_both(cfg, q, k, v)
    acc, ef = cfg.ac_vpu.acc_format, cfg.ef_format
    for cache in ("A", "B", "C", "D"):
        assert any(bool((getattr(t, cache).abs() >= acc.max_raw).any()) for t in tiles), cache
    assert any(abs(t.E) >= ef.max_raw or abs(t.F) >= ef.max_raw for t in tiles)
    zmax = (1 << (cfg.z_width - 1)) - 1
    assert any(int(st["z"].abs().max()) >= zmax for st in stats)
    assert len(exact_calls) > 50
    assert (o != 0).float().mean() > 0.5 and total(stats, "path") > 0 and total(stats, "mode_changes") > 0


def test_compact_center_is_the_narrowest_block_float_of_the_key():
    """compact_center: every mantissa fits center_bits signed bits, the exponent is the smallest that
    fits, the center is within half an LSB (2**(e-1)) of the key, |c| <= 2**(kv_width-1); at
    center_bits = kv_width the center is the key. Random keys of every magnitude plus extremes."""
    cfg0 = PRESETS["default"]
    gen = torch.Generator().manual_seed(SEEDS[2])
    k = torch.randint(-(1 << 15), 1 << 15, (3000, 64), generator=gen) >> torch.randint(0, 16, (3000, 1), generator=gen)
    k[:4] = torch.tensor([-(1 << 15), (1 << 15) - 1, 0, 1])[:, None]
    k[4, ::2], k[4, 1::2] = (1 << 15) - 1, -(1 << 15)
    for b in (2, 4, 6, 8, 12, 15, 16, 0):
        cfg = dataclasses.replace(cfg0, center_bits=b)
        mant, e = compact_center(k, cfg)
        lo, hi = -(1 << (cfg.center_element_bits - 1)), (1 << (cfg.center_element_bits - 1)) - 1
        assert int(mant.min()) >= lo and int(mant.max()) <= hi
        assert int(e.max()) < 1 << max(1, cfg.center_exp_width) and int(e.min()) >= 0
        prev = round_shift(k, (e - 1).clamp(min=0)[:, None])
        assert bool(((e == 0) | (prev.amin(-1) < lo) | (prev.amax(-1) > hi)).all())   # smallest exponent
        c = center_value(k, cfg)
        assert bool(((c - k).abs() <= (1 << e)[:, None] // 2).all()) and int(c.abs().max()) <= 1 << 15
        assert torch.equal(c, mant << e[:, None])
        if b in (0, 16):                    # 0: the key (kv_width bits), as 16 is
            assert torch.equal(c, k) and int(e.max()) == 0
        else:
            assert bool((e > 0).any()) and not torch.equal(c, k)


def test_batch_equals_per_head_models_compact_centers_and_groups():
    """6 heads in 2 groups of 3 that share their keys and values (GQA), 8-bit centers (6-bit at the
    small shape's 16-bit keys): bit-exact with per-head models; each group's candidates and actives
    are the union of its heads' (from the per-head models' traces), more than any head's alone and
    fewer than their sum."""
    cfg = small_with(center_bits=6, group=3, max_centers=64)
    q, k, v = random_heads(cfg, SEEDS[1], 6, 64)
    for g0 in (0, 3):
        k[g0 + 1:g0 + 3], v[g0 + 1:g0 + 3] = k[g0], v[g0]
    batch, tiles, stats, o = run_both(cfg, q, k, v)
    assert (o != 0).float().mean() > 0.5
    c = batch.centers[:, :int(batch.n_centers.min())].long()
    keys = {tuple(row) for row in k[0].tolist()}
    assert any(tuple(row) not in keys for row in c[0].tolist())                   # compaction changed centers
    assert torch.equal(batch.centers[0], batch.centers[1]) and torch.equal(batch.rho[3], batch.rho[5])
    gc, nc = total(stats, "group_candidates") / 3, total(stats, "candidates")
    per_head = [sum(int(st["candidates"][h]) for st in stats) for h in range(6)]
    assert max(per_head[:3]) < sum(int(st["group_candidates"][0]) for st in stats) < sum(per_head[:3])
    assert nc / 3 < gc < nc and total(stats, "group_active") > 0


@pytest.mark.parametrize("kind, kw", [("all_active", {}),
                                      ("all_active", {"guard_margin": 0.5, "cutoff": -0.25}),
                                      ("all_active", {"cutoff": -0.05}),
                                      ("zero_interval", {})])
def test_batch_equals_per_head_models_corners(kind, kw):
    """Unrelated queries (most positions change interval every step), a wide guard with a short
    PWL range, a tiny cutoff (nearly everything in the zero interval), and one dominant key
    (every other position quiet in the zero interval, counters halving)."""
    cfg = small_with(**kw)
    q, k, v = random_heads(cfg, SEEDS[0], 3, 40, kind)
    batch, _, stats, o = run_both(cfg, q, k, v)
    assert (o != 0).float().mean() > 0.5
    positions = total(stats, "position")
    if kind == "all_active" and not kw:
        assert total(stats, "active") > 0.4 * positions and total(stats, "mode_changes") > 20
    elif kind == "all_active":
        assert 0 < total(stats, "candidates") < 0.1 * positions and total(stats, "mode_changes") > 0
    else:
        assert total(stats, "candidates") < 0.1 * positions
        assert int(batch.counters[:, :batch.n].max()) == cfg.counter_max     # quiet counters saturate and halve


def test_step_api():
    cfg = SMALL
    batch = LadTileBatch(cfg, 2)
    assert batch.n == 0 and batch.n_centers.tolist() == [0, 0]
    z = torch.zeros(2, cfg.head_dim, dtype=torch.int64)
    o, st = batch.step(z, z, z)
    assert batch.n == 1 and batch.n_centers.tolist() == [1, 1] and o.shape == (2, cfg.head_dim)
    assert all(t.shape == (2,) and t.dtype == torch.int64 for t in st.values())


def far_below_m(cfg: LadTileConfig):
    """A small-tile sequence whose 13th key scores ~60 above the others; returns the tile's worst
    |o - o_float| / max|v| over its steps, the widest score span and the final modes."""
    from golden.lad_ref import LadHead
    d, f = cfg.head_dim, cfg.kv_format
    gen = torch.Generator().manual_seed(SEEDS[0])
    q = f.quantize(torch.randn(d, generator=gen)).expand(24, d)
    k = f.quantize(torch.randn(24, d, generator=gen) * 0.5)
    v = f.quantize(torch.randn(24, d, generator=gen))
    qr = q[0].double() * 2 ** -8
    k[12] = f.quantize(qr * 60 * d ** 0.5 / float(qr @ qr))               # s = q.k / sqrt(d) ~ +60
    batch, ref = LadTileBatch(cfg, 1), LadHead(cfg.reference())
    vmax, worst, span = float(f.to_float(v).abs().max()), 0.0, 0.0
    for i in range(24):
        o, _ = batch.step(q[None, i], k[None, i], v[None, i])
        of, _ = ref.step(f.to_float(q[i]), f.to_float(k[i]), f.to_float(v[i]))
        worst = max(worst, float((f.to_float(o[0]) - of).abs().max()) / vmax)
        s = (k[:i + 1] * q[i]).sum(-1).double() * 2 ** -16 / d ** 0.5
        span = max(span, float(s.max() - s.min()))
    return worst, span, batch.mode[0, :12]


def test_scores_far_below_m_keep_the_cache_identity():
    """A key far above the rest (real SmolLM2 heads: scores up to 107, m - s up to 113) moves the
    absorbed positions from their finite modes to the zero interval with x below -32: MD's
    corrections ``w = alpha x + beta`` need that x unsaturated. At the default score format
    (s18.9) the tile stays within the stated bound of its float twin on every step; the former
    s16.10 (floor -32) does not."""
    cfg = small_with(max_centers=64)
    worst, span, modes = far_below_m(cfg)
    assert span > 40 and int((modes == cfg.intervals).sum()) >= 10
    assert worst <= 0.05, worst
    assert far_below_m(small_with(max_centers=64, score_width=16, score_frac=10))[0] > 0.2


@pytest.mark.parametrize("group", [1, 3])
def test_llm_layer_state_counts_exact_passes_and_stops_past_the_kv_memory(group):
    """golden.llm.hooks.TileLayerState (the eval's per-layer tile): past max_positions every head's
    step is an exact pass (all keys and values read once per tile, output = the dense baseline's;
    its KV beats counted, for a tile of one head and of a group), past kv_positions a one-line
    ConfigError."""
    from golden.errors import ConfigError
    from golden.llm.hooks import TileLayerState
    cfg = small_with(max_positions=8, max_centers=8, kv_positions=12, group=group)
    H, d, f = 3, cfg.head_dim, cfg.kv_format
    q, k, v = (f.to_float(x) for x in random_heads(cfg, SEEDS[1], H, 13, kind="all_active"))
    k[1:], v[1:] = k[0], v[0]                    # one KV head: the group's query heads share it
    layer = TileLayerState(cfg, H, 1 / d ** 0.5, kv_group=H)
    tiles = H // group
    for i in range(12):
        o, st = layer.step(q[:, i], k[:, i], v[:, i])
        if i < 8:
            assert st["exact_steps"] == 0 and st["keys_read"] <= tiles * (i + 1)
            assert (st["kv_beats"] > 0 or i == 0) and st["kv_beats"] <= tiles * 2 * (i + 1) * cfg.beats
        else:
            assert st["exact_steps"] == H and st["keys_read"] == st["values_read"] == tiles * (i + 1)
            assert st["kv_beats"] == tiles * 2 * (i + 1) * cfg.beats
            raw = [f.quantize(t) for t in (q, k, v)]
            for h in range(H):
                ref, _, _ = dense_attention_bits(raw[0][h, i], raw[1][h, :i + 1], raw[2][h, :i + 1], cfg.fallback())
                assert torch.equal(f.quantize(o[h]), ref) and bool(ref.any())
    with pytest.raises(ConfigError, match="kv_positions = 12"):
        layer.step(q[:, 12], k[:, 12], v[:, 12])


def test_group_tile_cycles_and_reads():
    """A layer on tiles of 3 query heads (golden.llm.hooks.TileLayerState, golden.lad_tile.schedule_cycles
    at group 3), against tiles of one: the same outputs; the group-aware dense step is one head's
    plus the two further queries' beats; a group of different queries reads the union of its heads'
    candidates and actives (more than its busiest head, fewer than the three); its cycles are the
    group's fitted schedule (golden.lad_tile.schedule_constants), which tracks its RTL and not one
    head's model; the two groups take fewer cycles and read less than six tiles."""
    from golden.dense import dense_step_cycles
    from golden.lad_batch import LadTileBatch
    from golden.lad_tile import schedule_cycles
    from golden.llm.hooks import TileLayerState
    one, grouped = small_with(center_bits=6, max_centers=64), small_with(center_bits=6, group=3, max_centers=64)
    q, k, v = random_heads(one, SEEDS[2], 6, 48)
    k[1:3], v[1:3], k[4:6], v[4:6] = k[0], v[0], k[3], v[3]      # two KV heads of three query heads
    q[1:3] = q[0]                                                # the first group: one query thrice
    f, scale = one.kv_format, one.head_dim ** -0.5
    singles, groups = TileLayerState(one, 6, scale, 3), TileLayerState(grouped, 6, scale, 3)
    b1, b3 = LadTileBatch(one, 6), LadTileBatch(grouped, 6)
    tiles = {"cycles": [0.0, 0.0], "reads": [0, 0]}
    union_reads, busiest_reads, sum_reads = 0, 0, 0
    for i in range(48):
        raw = [f.to_float(t[:, i]) for t in (q, k, v)]
        o1, st1 = singles.step(*raw)
        o3, st3 = groups.step(*raw)
        assert torch.equal(o1, o3) and st3["readers"] == 2 and st1["readers"] == 6
        dense1 = dense_step_cycles(one, i + 1)
        assert st3["dense_cycles"] == 2 * (dense1 + 2 * one.beats) and st1["dense_cycles"] == 6 * dense1
        if i >= 8:
            tiles["cycles"][0] += st1["tile_cycles"]
            tiles["cycles"][1] += st3["tile_cycles"]
            tiles["reads"][0] += st1["kv_beats"]
            tiles["reads"][1] += st3["kv_beats"]
        _, s1 = b1.step(q[:, i], k[:, i], v[:, i])
        _, s3 = b3.step(q[:, i], k[:, i], v[:, i])

        union = one.beats * int(s3["group_candidates"][3] + s3["group_active"][3])
        each = [int(s1["kv_beats"][h]) for h in range(3, 6)]
        union_reads, busiest_reads, sum_reads = union_reads + union, busiest_reads + max(each), sum_reads + sum(each)
        assert max(each) <= union <= sum(each)
        if i >= 8:   # the layer's tile cycles are the group's schedule of its union and busiest head
            assert st3["tile_cycles"] == sum(
                float(schedule_cycles(grouped, i, int(s3["centers"][h] - s3["new_center"][h]),
                                      one.beats * int(s3["group_candidates"][h] + s3["group_active"][h]),
                                      int(s3["mode_changes"][h:h + 3].max()), int(s3["new_center"][h])))
                for h in (0, 3))
    assert busiest_reads < union_reads < sum_reads
    assert 0 < tiles["cycles"][1] < tiles["cycles"][0] and 0 < tiles["reads"][1] < tiles["reads"][0]
