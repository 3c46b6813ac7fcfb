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
}
MERGE_CONFIGS = {"tiny": PRESETS["tiny"], "default": PRESETS["default"]}


@pytest.mark.parametrize("name", list(MATCH_CONFIGS))
def test_match_rtl_equals_golden(name):
    report = simulate("mac-match", MATCH_CONFIGS[name], "testbenches.tb.tb_mac_match", seed=SEED, name=name,
                      params={"vectors": 1000 if name == "tiny" else 400})
    assert report["mismatches"] == 0
    assert report["hits"] > 50 and report["vectors"] - report["hits"] > 50  # both decisions exercised
    assert report["at_threshold"] > 0  # distance exactly at the threshold (a miss) was seen


@pytest.mark.parametrize("name", list(MERGE_CONFIGS))
def test_merge_rtl_equals_golden(name):
    report = simulate("mac-merge", MERGE_CONFIGS[name], "testbenches.tb.tb_mac_merge", seed=SEED, name=name,
                      params={"vectors": 1000 if name == "tiny" else 300})
    assert report["mismatches"] == 0
    assert 0 < report["flagged"] < report["vectors"] // 2
    assert report["nonzero_outputs"] > report["beats"] // 2


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
