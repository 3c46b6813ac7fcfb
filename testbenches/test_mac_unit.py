"""MAC unit: Match and Merge under Verilator vs golden.mac_unit (bit-exact) on random
and corner cases, and the golden model's own invariants."""
import pytest
import torch

from golden.errors import ConfigError
from golden.mac_unit import PRESETS, MacUnitConfig, MatchModel
from testbenches.runner import simulate

SEED = 2604
MATCH_CONFIGS = {
    "tiny": PRESETS["tiny"],  # window 8: wraps every 8 queries of a head
    "wide": MacUnitConfig(window=24, head_dim=32, heads=3, lanes=8, q_width=12, q_frac=6, tau=0.3),
    # one beat per query (the head on it), a window of 2^3 - 1 (the scan's counters at their top)
    "one-beat": MacUnitConfig(window=7, head_dim=8, heads=2, lanes=8),
}
MERGE_CONFIGS = {"tiny": PRESETS["tiny"], "default": PRESETS["default"]}


@pytest.mark.parametrize("name", list(MATCH_CONFIGS))
def test_match_rtl_equals_golden(name):
    report = simulate("mac-match", MATCH_CONFIGS[name], "testbenches.tb.tb_mac_match", seed=SEED, name=name,
                      params={"vectors": 1000 if name == "tiny" else 400})
    assert report["mismatches"] == 0
    assert report["hits"] > 50 and report["vectors"] - report["hits"] > 50  # both decisions exercised
    assert report["at_threshold"] > 0  # distance exactly at the threshold (a miss) was seen


@pytest.mark.parametrize("heads, banks", [(5, 2), (9, 3), (13, 4), (17, 5)])
def test_match_rtl_equals_golden_across_ring_banks(heads, banks):
    """A ring deeper than one bank (512 words per head, 2048 per bank, the last bank a part
    one): the pair-then-bank select with an odd bank out (3, 5), several pairs (4, 5) and every
    pair full (4: the second pair's select was not exercised without it, mutation run s39)."""
    from hdl.mac.match import RING_BANK_DEPTH
    cfg = MacUnitConfig(window=64, head_dim=64, heads=heads, lanes=8)
    assert (banks - 1) * RING_BANK_DEPTH < cfg.ring_words < banks * RING_BANK_DEPTH
    report = simulate("mac-match", cfg, "testbenches.tb.tb_mac_match", seed=SEED, name=f"banked{banks}",
                      params={"vectors": 200 if banks == 2 else 8 * heads})
    assert report["mismatches"] == 0 and report["hits"] > 20


@pytest.mark.parametrize("name", list(MERGE_CONFIGS))
def test_merge_rtl_equals_golden(name):
    report = simulate("mac-merge", MERGE_CONFIGS[name], "testbenches.tb.tb_mac_merge", seed=SEED, name=name,
                      params={"vectors": 1000 if name == "tiny" else 300})
    assert report["mismatches"] == 0
    assert 0 < report["flagged"] < report["vectors"] // 2
    assert report["nonzero_outputs"] > report["beats"] // 2


def test_exp2_of_every_nonpositive_score_is_at_most_one():
    """Why Merge's a and b need only sum_width bits (hdl/mac/merge.py): the smaller-max sum is
    scaled by EXP2 of x <= 0, whose result m 2^-(frac + k) is <= 1 for every x of the format, so
    the scaled sum never exceeds the sum it scales."""
    from golden.sfm import exp2
    for cfg in MERGE_CONFIGS.values():
        x = torch.arange(cfg.sfm.x_format.min_raw, 1, dtype=torch.int64)
        mant, k = exp2(x, cfg.sfm)
        assert int(k.min()) >= 0 and int(mant.max()) <= 1 << cfg.mantissa_frac
        assert int(mant[-1]) == 1 << cfg.mantissa_frac and int(k[-1]) == 0   # x = 0 reaches 1 exactly


@pytest.mark.parametrize("sum_width, cancel_bits", [(8, 12), (8, 1), (22, 6), (44, 12)])
def test_merge_bench_cases_lie_in_their_formats(sum_width, cancel_bits):
    """The merge bench's transactions at narrow and wide sum formats (the fuzzer draws them): every
    m and s inside its format (a value outside would reach the RTL wrapped); saturated and tiny sums drawn."""
    import random
    from testbenches.tb.tb_mac_merge import synthetic_cases
    cfg = MacUnitConfig(sum_width=sum_width, sum_frac=4, cancel_bits=cancel_bits)
    cases = synthetic_cases(cfg, random.Random(SEED), 3000)
    smax, sf = cfg.sum_format.max_raw, cfg.score_format
    assert all(0 <= c[2] <= smax and 0 <= c[5] <= smax for c in cases)
    assert all(sf.min_raw <= c[1] <= sf.max_raw and sf.min_raw <= c[4] <= sf.max_raw for c in cases)
    assert sum(c[5] == smax for c in cases) > 50 and sum(c[2] + c[5] <= 3 for c in cases) > 50


def test_mac_unit_rtl_equals_golden():
    """The unit top: Match and Merge behind their stream ports, both halves busy at once."""
    report = simulate("mac-unit", PRESETS["tiny"], "testbenches.tb.tb_mac_unit", seed=SEED, name="tiny",
                      params={"vectors": 300})
    assert report["mismatches"] == 0
    assert report["matches"] == 300 and report["merges"] == 301 and report["vectors"] == 601
    assert report["hits"] > 20 and report["matches"] - report["hits"] > 20
    assert 0 < report["flagged"] < report["merges"] // 2 and report["nonzero_outputs"] > report["beats"] // 2


def test_match_model_ties_go_to_the_lower_position():
    cfg = PRESETS["tiny"]
    model = MatchModel(cfg)
    q = torch.arange(cfg.head_dim) * 3
    assert model.query(0, q).hit is False  # empty window
    model.query(0, q + 1000)
    model.query(0, q)  # position 2, same as position 0
    r = model.query(0, q)
    assert (r.hit, r.position, r.distance) == (True, 0, 0)
    for _ in range(cfg.window):  # push position 0..2 out of the window
        model.query(0, q + 5000)
    r = model.query(0, q)
    assert not r.hit and r.position == 4 and r.slot == 4  # oldest of the equal candidates 4..11


def test_mac_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="multiple of lanes"):
        MacUnitConfig(head_dim=60, lanes=8)
    with pytest.raises(ConfigError, match="tau"):
        MacUnitConfig(tau=1.5)
    # fuzz mac-decode seed 15: a score_width the SFM cannot take was accepted, then refused at build
    with pytest.raises(ConfigError, match="score_width must be 8..24"):
        MacUnitConfig(score_width=30)


# -- real SmolLM2 data (testbenches/data/smollm2_mac_trace.pt, from benchmarks/record_mac_trace.py) --------
TRACE = __import__("pathlib").Path(__file__).parent / "data" / "smollm2_mac_trace.pt"
TRACE_MATCH_CONFIG = MacUnitConfig(window=64, head_dim=64, heads=3, lanes=16)


def _trace():
    return torch.load(TRACE)


def test_match_rtl_equals_golden_on_real_queries():
    report = simulate("mac-match", TRACE_MATCH_CONFIG, "testbenches.tb.tb_mac_match", seed=SEED, name="trace",
                      params={"trace": str(TRACE), "vectors": 120})
    assert report["mismatches"] == 0
    assert report["vectors"] == 360
    assert len(set(report["distances"])) > 300  # real, varied distances


def test_merge_rtl_equals_golden_on_real_states():
    report = simulate("mac-merge", PRESETS["default"], "testbenches.tb.tb_mac_merge", seed=SEED, name="trace",
                      params={"trace": str(TRACE), "vectors": 1000})
    assert report["mismatches"] == 0
    assert report["vectors"] == len(_trace()["merge_cases"]) >= 150
    assert report["nonzero_outputs"] > report["beats"] // 2


def merge_error_bound(w1: float, w2: float, o1: torch.Tensor, o2: torch.Tensor, cfg) -> float:
    """Stated bound (docs/mac-unit.md) on |o_bit-accurate - o_float| per element: the weights'
    relative error (EXP2 + RECIP + sum rounding, 2e-4) on |w1 o1| + |w2 o2|, the inputs'
    quantisation and the output rounding."""
    lsb = 2.0 ** -cfg.out_frac
    return float((abs(w1) * o1.abs().max() + abs(w2) * o2.abs().max()) * 2e-4 + (abs(w1) + abs(w2) + 1) * lsb)


def test_merge_bit_accurate_within_bound_of_float_on_real_states():
    from golden.mac_unit import MergeOp, merge_bits, raw_to_lse
    cfg = PRESETS["default"]
    trace = _trace()
    worst, flagged, checked = 0.0, 0, 0
    for (op, m1, s1, o1, m2, s2, o2), want_o, want_lse in zip(trace["merge_cases"], trace["expect_o"],
                                                           trace["expect_lse"]):
        o1f, o2f = cfg.out_format.to_float(torch.tensor(o1)), cfg.out_format.to_float(torch.tensor(o2))
        r = merge_bits(op, m1, s1, torch.tensor(o1), m2, s2, torch.tensor(o2), cfg)
        lse1, lse2 = raw_to_lse(m1, s1, cfg), raw_to_lse(m2, s2, cfg)
        t = __import__("math").exp(lse2 - lse1)
        if r.flagged:
            flagged += 1
            assert op == MergeOp.DOWNDATE and 1 - t < 2.0 ** -cfg.cancel_bits * 1.01
            continue
        w1, w2 = (1 / (1 - t), -t / (1 - t)) if op == MergeOp.DOWNDATE else (1 / (1 + t), t / (1 + t))
        err = float((cfg.out_format.to_float(torch.tensor(r.o)) - want_o.double()).abs().max())
        assert err <= merge_error_bound(w1, w2, o1f, o2f, cfg), (op, err, w1, w2)
        assert abs(raw_to_lse(r.m, r.s, cfg) - float(want_lse)) < 1e-3 * max(1.0, abs(w1))
        worst, checked = max(worst, err), checked + 1
    assert checked > 100 and worst > 0


def test_match_decisions_vs_float_reference_on_real_queries():
    """Bit-accurate Match vs golden.mac_ref.match (float) over the whole trace at M = 512: hit
    decisions may differ only where the float distance is within one quantisation step
    (sqrt(d) * 2^-q_frac) of the threshold; the count is reported in docs/mac-unit.md."""
    from golden.mac_ref import match
    cfg = PRESETS["default"]
    ref = cfg.reference()
    q = _trace()["q_pre"].double()
    steps, heads, d = q.shape
    model = MatchModel(cfg)
    ring = torch.zeros(heads, cfg.window, d, dtype=torch.float64)
    ring_pos = torch.full((cfg.window,), -1, dtype=torch.long)
    step_q = cfg.q_format.lsb * d ** 0.5
    differ, hits = 0, 0
    for pos in range(steps):
        qq = q[pos]  # the float reference sees the unquantised queries
        hit_f, _, dist_f = match(ring, ring_pos, torch.ones(heads, cfg.window, dtype=torch.bool), qq,
                                 ref.threshold(d))
        for h in range(heads):
            r = model.query(h, cfg.q_format.quantize(q[pos, h]))
            hits += r.hit
            if r.hit != bool(hit_f[h]):
                differ += 1
                assert abs(float(dist_f[h]) - ref.threshold(d)) <= step_q
        ring[:, pos % cfg.window] = qq
        ring_pos[pos % cfg.window] = pos
    assert hits > steps  # real queries do hit at tau = 0.45
    assert differ <= 0.01 * steps * heads
