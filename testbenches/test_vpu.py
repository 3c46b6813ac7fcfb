"""VPU under Verilator vs golden.vpu (bit-exact) and golden bit-accurate vs float bounds."""

from dataclasses import replace

import pytest
import torch

from golden.errors import ConfigError
from golden.lad_tile import LadTileConfig
from golden.vpu import PRESETS, VpuConfig, VpuOp, axpy, axpy_float, reduce_beats, reduce_float, to_beats
from testbenches.runner import simulate

SEED = 20261122


# the presets, and the LAD tile's AC VPU (30-bit operands, a 62-bit accumulator: its add is split, arith.py)
CONFIGS = {**PRESETS, "ac": LadTileConfig().ac_vpu}


@pytest.mark.parametrize("preset", ["default", "narrow", "kv_factor", "stall_free", "ac"])
def test_vpu_rtl_equals_golden(preset):
    report = simulate("vpu", CONFIGS[preset], "testbenches.tb.tb_vpu", seed=SEED, name=preset,
                      params={"vectors": 1000})
    assert report["mismatches"] == 0
    assert report["vectors"] >= 1000
    assert report["nonzero_outputs"] > 500
    assert report["interleaved"] > 50 and report["axpy_not_last"] > 50


def test_vpu_golden_vs_float_bound():
    cfg = PRESETS["default"]
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(200):
        d = int(torch.randint(1, 100, (1,), generator=gen))
        a = torch.randint(-2**15, 2**15, (d,), generator=gen)
        b = torch.randint(-2**15, 2**15, (d,), generator=gen)
        for op in (VpuOp.DOT, VpuOp.SQDIST):
            assert reduce_beats(op, to_beats(a, cfg.lanes), to_beats(b, cfg.lanes), cfg) == reduce_float(op, a, b)
        scalar = int(torch.randint(-2**15, 2**15, (1,), generator=gen))
        acc = torch.randint(-2**30, 2**30, (d,), generator=gen)
        err = (axpy(scalar, a, acc, cfg).double() - axpy_float(scalar, a, acc, cfg)).abs().max()
        assert err <= 0.5


def test_vpu_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="acc_width"):
        VpuConfig(in_width=16, acc_width=20)
    with pytest.raises(ConfigError, match="lanes"):
        VpuConfig(lanes=0)
    with pytest.raises(ConfigError, match="a_width"):
        VpuConfig(in_width=16, a_width=17)


def test_vpu_narrow_a_halves_the_wide_multipliers():
    """AC's VPU (30-bit operands, a = q, k or v at 16 bits): two 18 x 18 pieces a lane instead of
    four, no SQDIST (refused by the block and the model), and a value of a past its width refused by
    the model (the RTL would cut it: no silent garbage)."""
    from amaranth.back import rtlil
    from hdl.lib.vpu import Vpu
    narrow = CONFIGS["ac"]
    assert narrow.a_format.width == 16 and VpuOp.SQDIST not in narrow.ops
    muls = {name: rtlil.convert(Vpu(c, ops=(VpuOp.DOT, VpuOp.AXPY))).count("cell $mul ")
            for name, c in (("narrow", narrow), ("full", replace(narrow, a_width=0)))}
    assert muls == {"narrow": 2 * narrow.lanes, "full": 4 * narrow.lanes}
    with pytest.raises(ValueError, match="SQDIST"):
        Vpu(narrow, ops=(VpuOp.SQDIST,))
    beats = torch.ones(2, narrow.lanes, dtype=torch.int64)
    with pytest.raises(ValueError, match="SQDIST"):
        reduce_beats(VpuOp.SQDIST, beats, beats, narrow)
    top = (2 ** 15 - 1) * (2 ** 29 - 1)   # a's and b's largest
    assert reduce_beats(VpuOp.DOT, beats * (2 ** 15 - 1), beats * (2 ** 29 - 1), narrow) == 2 * narrow.lanes * top
    with pytest.raises(ValueError, match="a outside its 16 bits"):
        reduce_beats(VpuOp.DOT, beats * 2 ** 15, beats, narrow)
    with pytest.raises(ValueError, match="a outside"):
        axpy(1, torch.full((narrow.lanes,), -2 ** 15 - 1), torch.zeros(narrow.lanes, dtype=torch.int64), narrow)


def test_vpu_builds_only_its_users_operations():
    """A DOT-only VPU (EAS's, MD's) has no AXPY lanes or SQDIST subtractors: a smaller netlist;
    an empty or foreign set of operations is refused. (Its results: the EAS, MD and tile benches.)"""
    from amaranth.back import rtlil
    from hdl.lib.vpu import Vpu
    cfg = PRESETS["default"]
    size = {ops: len(rtlil.convert(Vpu(cfg, ops=ops))) for ops in (tuple(VpuOp), (VpuOp.DOT,))}
    assert size[(VpuOp.DOT,)] < 0.7 * size[tuple(VpuOp)]
    for bad in ([], ["DOT"]):
        with pytest.raises(ValueError, match="Vpu ops"):
            Vpu(cfg, ops=bad)
