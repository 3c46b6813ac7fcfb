"""Dense PWL attention baseline under Verilator vs golden.dense (bit-exact), on random
steps and on a real SmolLM2 head; and the bit-accurate model vs its float twin."""
from pathlib import Path

import pytest
import torch

from golden.dense import PRESETS, DenseConfig, dense_attention_bits, dense_attention_float, dense_step_cycles
from golden.errors import ConfigError
from golden.sfm import exp_bound, recip, recip_relative_bound
from testbenches.runner import simulate

SEED = 4096
TRACE = Path(__file__).parent / "data" / "smollm2_head_trace.pt"
# layer 9's query heads 3-5, which share KV head 1 (benchmarks.record_lad_trace --tokens 256 --heads 9:3 9:4 9:5)
GROUP_TRACE = Path(__file__).parent / "data" / "smollm2_group_trace.pt"
# beats not a power of two (6): the beat counters wrap by their compare, not by overflowing (4 lanes:
# its build is a third of an 8-lane one's; a 48 x 8 config's 21 s are 7 s)
SIX_BEATS = DenseConfig(head_dim=24, lanes=4, max_positions=256)
GROUP3 = PRESETS["group3"]   # the group-aware block: SmolLM2's 3 query heads of a KV head on one KV stream
CONFIGS = {**PRESETS, "six-beats": SIX_BEATS}


@pytest.mark.parametrize("preset, max_len, steps", [("small", 40, 25), ("default", 24, 12), ("six-beats", 20, 8),
                                                    ("group3", 24, 10)])
def test_dense_rtl_equals_golden_random(preset, max_len, steps):
    report = simulate("dense", CONFIGS[preset], "testbenches.tb.tb_dense", seed=SEED, name=preset,
                      params={"steps": steps, "max_len": max_len})
    assert report["mismatches"] == 0 and report["steps"] == steps
    assert report["beats"] == steps * CONFIGS[preset].group * CONFIGS[preset].beats
    assert 1 in report["lengths"] and max_len in report["lengths"]  # shortest and longest contexts
    assert report["nonzero_outputs"] > report["beats"] // 2


@pytest.mark.parametrize("preset", ["small", "default", "six-beats", "group3"])
def test_dense_rtl_cycles_equal_schedule(preset):
    """With nothing stalling each step's cycles are golden.dense.dense_step_cycles (small: 4 beats, six-beats:
    6, fewer than the VPU's latency, so the value pass waits for N's write-back; default: 8, it does not;
    group3: three heads on one KV stream, the further queries' beats added)."""
    lengths = [1, 2, 3, 17]
    report = simulate("dense", CONFIGS[preset], "testbenches.tb.tb_dense", seed=SEED, name="cycles",
                      params={"steps": len(lengths), "lengths": lengths, "gap": 0.0, "stall": 0.0, "latency": [1, 1]})
    assert report["mismatches"] == 0
    assert report["step_cycles"] == [dense_step_cycles(CONFIGS[preset], n) for n in lengths]


def test_dense_rtl_output_on_rounding_boundary():
    """Every output element one LSB of N below its rounding boundary: N must be exact to its last bit."""
    report = simulate("dense", PRESETS["default"], "testbenches.tb.tb_dense", seed=SEED, name="boundary",
                      params={"boundary": True})
    assert report["mismatches"] == 0 and report["steps"] == 1 and report["nonzero_outputs"] == report["beats"]


def test_dense_rtl_output_sum_one_below_rounding_step():
    """Every output element's N r + half one below its rounding step: that sum must be exact to its last unit."""
    report = simulate("dense", PRESETS["default"], "testbenches.tb.tb_dense", seed=SEED, name="tie",
                      params={"tie": True})
    assert report["mismatches"] == 0 and report["steps"] == 1 and report["nonzero_outputs"] == report["beats"]


def test_dense_rtl_equals_golden_on_real_smollm2_head():
    report = simulate("dense", PRESETS["default"], "testbenches.tb.tb_dense", seed=SEED, name="trace",
                      params={"trace": str(TRACE), "steps": 3, "max_len": 400, "latency": [1, 4]})
    assert report["mismatches"] == 0
    assert max(report["lengths"]) == 400
    assert report["kv_requests"] == sum(2 * n * PRESETS["default"].beats for n in report["lengths"])


def test_dense_group_rtl_equals_golden_on_a_real_smollm2_kv_group():
    """A real KV group's three query heads on one KV stream: each key and value beat requested once
    for the group, each head's output bit-exact."""
    report = simulate("dense", GROUP3, "testbenches.tb.tb_dense", seed=SEED, name="group-trace",
                      params={"trace": str(GROUP_TRACE), "steps": 3, "max_len": 256, "latency": [1, 4]})
    assert report["mismatches"] == 0 and report["beats"] == 3 * 3 * GROUP3.beats
    assert max(report["lengths"]) == 256 and report["nonzero_outputs"] == report["beats"]
    assert report["kv_requests"] == sum(2 * n * GROUP3.beats for n in report["lengths"])


def float_bound(qf, kf, vf, cfg):
    """Stated bound on |o_bits - o_float_pwl| (docs/lad-tile.md): each p_i is off by at most
    the coefficient/rounding bound plus slope x score rounding (half an LSB of x); o moves by at
    most 2 max|v| sum|dp_i| / Z, plus the reciprocal's relative error and the output rounding."""
    s = (kf.double() @ qf.double()) / cfg.head_dim ** 0.5
    x = s - s.max()
    p = cfg.sfm.pwl.exp(x)
    slope = torch.tensor(cfg.sfm.pwl.slopes, dtype=torch.float64)[cfg.sfm.pwl.interval_of(x)]
    dp = exp_bound(x, cfg.sfm) + slope * 2.0 ** -(cfg.sfm.x_frac) + 2.0 ** -cfg.sfm.out_frac
    o = (p[:, None] * vf.double()).sum(0) / p.sum()
    return 2 * vf.abs().max() * dp.sum() / p.sum() + recip_relative_bound(cfg.sfm) * o.abs().max() \
        + 2.0 ** -cfg.kv_frac


def test_dense_bit_accurate_within_bound_of_float_on_real_head():
    cfg = PRESETS["default"]
    t = torch.load(TRACE)
    f = cfg.kv_format
    q, k, v = (f.quantize(t[n].float()) for n in ("q", "k", "v"))
    worst_ratio = 0.0
    for pos in range(16, q.shape[0], 37):
        qf, kf, vf = f.to_float(q[pos]), f.to_float(k[:pos + 1]), f.to_float(v[:pos + 1])
        o, _, _ = dense_attention_bits(q[pos], k[:pos + 1], v[:pos + 1], cfg)
        err = (f.to_float(o) - dense_attention_float(qf, kf, vf, cfg)).abs().max()
        bound = float_bound(qf, kf, vf, cfg)
        assert err <= bound, (pos, float(err), float(bound))
        worst_ratio = max(worst_ratio, float(err / bound))
        assert o.abs().max() > 0
    assert worst_ratio > 0.01  # the bound is not vacuous


def test_dense_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="4 beats"):
        DenseConfig(head_dim=16, lanes=8)
    with pytest.raises(ConfigError, match="cutoff"):
        DenseConfig(cutoff=-1000.0)   # below the s18.9 score range (-256)


@pytest.mark.parametrize("cfg", [*CONFIGS.values(), DenseConfig(kv_width=4, kv_frac=2, max_positions=1 << 16),
                                 DenseConfig(kv_width=20, kv_frac=10, max_positions=2)],
                         ids=[*CONFIGS, "kv4-65536", "kv20-2"])
def test_dense_output_sum_fits_its_width(cfg):
    """The RTL's output sum N r + 2^(s-1) fits cfg.out_sum_width signed bits at every Z (no zero flag for
    large shifts, no spare bit): |N| <= Z max|v|, and RECIP's r is the same for every Z of one bucket
    (the bits below its table's index and offset dropped), so each bucket's largest Z bounds it."""
    sfm, top = cfg.sfm, 1 << (cfg.out_sum_width - 1)
    kept = sfm.table_index_bits + sfm.table_delta_bits   # Z's bits below the leading one that RECIP reads
    widest = 0
    for k in range(cfg.sfm_out_width_sum):
        if k <= kept:
            z = torch.arange(1 << k, 2 << k)
        else:
            z = ((torch.arange(1 << kept) + (1 << kept)) << (k - kept)) + ((1 << (k - kept)) - 1)
        r, kk = recip(z, sfm)
        s = sfm.mantissa_frac + k
        assert (kk == k).all() and s <= cfg.out_shift_max
        rz = int((r * z).max())                   # r Z < 2^50: exact in int64
        n_r = rz << (cfg.kv_width - 1)            # the largest |N r|
        assert n_r + (1 << (s - 1)) < top and -n_r + (1 << (s - 1)) >= -top, k
        widest = max(widest, n_r)
    assert widest >= top >> 1   # one bit fewer would not hold it
