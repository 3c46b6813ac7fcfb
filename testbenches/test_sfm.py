"""SFM under Verilator vs golden.sfm (bit-exact), and the stated error bounds of the
bit-accurate model vs its float twins (docs/numerics.md)."""
import pytest
import torch

from golden.errors import ConfigError
from golden.sfm import (PRESETS, SfmConfig, exp2, exp2_relative_bound, exp_bound, exp_pwl, exp_pwl_float,
                        mantissa_value, recip, recip_relative_bound)
from testbenches.runner import simulate

SEED = 7


@pytest.mark.parametrize("preset", ["default", "small", "lad16", "wide_x", "dsp_registers", "stall_free",
                                    "mac_decode", "mac_merge"])
def test_sfm_rtl_equals_golden(preset):
    """lad16's x reaches -64, where EXP2's exponent saturates at kmax (the others' x does not);
    wide_x's x reaches -128, beyond EXP2's clamp of |x| (stage 1's ``below``)."""
    report = simulate("sfm", PRESETS[preset], "testbenches.tb.tb_sfm", seed=SEED, name=preset,
                      params={"vectors": 1000})
    assert report["mismatches"] == 0
    assert report["vectors"] >= 1000
    assert report["nonzero_outputs"] > 500


@pytest.mark.parametrize("preset", list(PRESETS))
def test_exp_bit_accurate_within_bound_of_float_pwl(preset):
    cfg = PRESETS[preset]
    x = torch.arange(cfg.x_format.min_raw, 1)  # every representable x <= 0
    y, r = exp_pwl(x, cfg)
    xf = cfg.x_format.to_float(x)
    err = (cfg.out_format.to_float(y) - exp_pwl_float(xf, cfg)).abs()
    assert (err <= exp_bound(xf, cfg)).all()
    assert int(y[-1]) > 0 and int(y[0]) == 0  # exp(0) ~ 1, far below the cutoff -> 0
    assert torch.equal(r, cfg.pwl.interval_of(xf))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_pwl_relative_error_is_the_analytic_minimax(preset):
    cfg = PRESETS[preset]
    x = torch.linspace(cfg.cutoff, 0, 200001, dtype=torch.float64)
    rel = (exp_pwl_float(x, cfg) / torch.exp(x) - 1).abs().max()
    assert abs(rel - cfg.pwl.max_relative_error) < 1e-6


@pytest.mark.parametrize("preset", list(PRESETS))
def test_recip_within_stated_relative_bound(preset):
    cfg = PRESETS[preset]
    gen = torch.Generator().manual_seed(SEED)
    z = torch.cat([torch.arange(1, 4097), torch.randint(1, 2 ** cfg.recip_in_width, (100000,), generator=gen),
                   torch.tensor([2 ** cfg.recip_in_width - 1])])
    m, k = recip(z, cfg)
    rel = (mantissa_value(m, k, cfg) * z.double() - 1).abs()
    assert rel.max() <= recip_relative_bound(cfg)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_exp2_within_stated_relative_bound(preset):
    cfg = PRESETS[preset]
    x = torch.arange(max(cfg.x_format.min_raw, -(40 << cfg.x_frac)), 1)  # down to exp(-40)
    m, k = exp2(x, cfg)
    xf = cfg.x_format.to_float(x)
    rel = (mantissa_value(m, k, cfg) / torch.exp(xf) - 1).abs()
    assert (rel <= exp2_relative_bound(xf, cfg)).all(), float((rel - exp2_relative_bound(xf, cfg)).max())
    assert int(m[-1]) > 0 and int(k[-1]) == 0  # exp(0) ~ 1


def test_sfm_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="cutoff"):
        SfmConfig(cutoff=-40.0)
    with pytest.raises(ConfigError, match="table_index_bits"):
        SfmConfig(table_index_bits=0)
