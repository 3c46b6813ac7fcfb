"""SRAM bank under Verilator vs the cycle-ordered reference model (bit-exact)."""
import pytest

from golden.errors import ConfigError
from golden.sram import PRESETS, SramConfig
from testbenches.runner import simulate

SEED = 11


@pytest.mark.parametrize("preset", ["default", "dual", "deep", "banked"])
def test_sram_rtl_equals_model(preset):
    report = simulate("sram", PRESETS[preset], "testbenches.tb.tb_sram", seed=SEED, name=preset,
                      params={"vectors": 1000})
    assert report["mismatches"] == 0
    assert report["vectors"] >= 1000
    assert report["nonzero_outputs"] > 100


def test_sram_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="read_latency"):
        SramConfig(read_latency=0)
