"""SRAM bank under Verilator vs the cycle-ordered reference model (bit-exact)."""
import pytest

from golden.errors import ConfigError
from golden.sram import PRESETS, SramConfig
from testbenches.runner import simulate

SEED = 11


@pytest.mark.parametrize("preset", ["default", "unregistered", "dual", "deep", "banked", "tree", "registered-address",
                                    "registered-address-one-bank"])
def test_sram_rtl_equals_model(preset):
    report = simulate("sram", PRESETS[preset], "testbenches.tb.tb_sram", seed=SEED, name=preset,
                      params={"vectors": 1000})
    assert report["mismatches"] == 0
    assert report["vectors"] >= 1000
    assert report["nonzero_outputs"] > 100


def test_sram_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="read_latency"):
        SramConfig(read_latency=0)


@pytest.mark.parametrize("depth, width, tile", [
    (1024, 18, (1024, 18)),   # one block RAM
    (2048, 8, (2048, 9)),     # one 2048 x 9 (two 1024 x 18 or two 4096 x 4 otherwise)
    (512, 64, (1024, 18)),    # four 1024 x 18 side by side (eight 2048 x 9)
    (4096, 16, (4096, 4)),    # four tiles three ways (4096 x 4, 2048 x 9, 1024 x 18): the deepest
    (3000, 5, (4096, 4)),     # two tiles two ways (4096 x 4, 2048 x 9): the deepest
    (16384, 1, (16384, 1)),
    (256, 32, (1024, 18)),    # two read ports: two 1024 x 18 side by side
])
def test_bram_tile_is_fewest_then_deepest(depth, width, tile):
    """A registered bank's block-RAM geometry: the fewest DP16KD tiles, the deepest among equals
    (hdl/lib/sram.py ``bram_tile``; docs/architecture.md, SRAM banks)."""
    from hdl.lib.sram import bram_tile
    assert bram_tile(depth, width) == tile


@pytest.mark.parametrize("depth, width, tile", [
    (256, 32, (512, 36)),     # one pseudo dual-port block RAM, not two 1024 x 18
    (512, 20, (512, 36)),     # one, not two 1024 x 18 (or three 2048 x 9)
    (4096, 64, (4096, 4)),    # sixteen either way: the true dual-port geometry (the deepest)
    (1024, 18, (1024, 18)),
])
def test_bram_tile_with_one_read_port_may_be_pseudo_dual_port(depth, width, tile):
    from hdl.lib.sram import bram_tile
    assert bram_tile(depth, width, read_ports=1) == tile
