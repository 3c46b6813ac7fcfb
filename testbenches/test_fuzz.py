"""Config-space fuzzing (testbenches/fuzz.py): a random valid config is emitted and bit-exact
under Verilator; random invalid configs fail with one line; draws replay from their seed.
`make fuzz` runs many more."""
from __future__ import annotations

import random

import pytest

import ladmac_cli
from golden.errors import ConfigError
from hdl.registry import BLOCKS, get_block
from testbenches.fuzz import _job, draw_raw, fuzz_one, random_config


def test_random_vpu_config_bit_exact():
    """Found by this fuzzer: at lanes=4 in_width=4 acc_width=20 the bench's saturation corner cases are
    4096 beats each and its drain timeout did not follow the beats (2 of 110 results in time)."""
    report = fuzz_one("vpu", seed=2, vectors=100)   # lanes 4, in_width 4, acc_width 20, axpy_shift 7
    assert report["mismatches"] == 0 and report["vectors"] >= 100, report


@pytest.mark.parametrize("block, seed", [("sram", 11), ("sfm", 36), ("mac-unit", 21), ("lad-md", 29)])
def test_configs_the_fuzzer_broke_the_benches_on(block, seed):
    """sram seed 11 (width 1: a 1-bit payload reads as a cocotb Logic, which the stream sink took
    for a LogicArray) and sfm seed 36 (x_width 6, x_frac 1: the cutoff's corner cases and random
    EXP inputs lay outside x's format, -33 in a 6-bit field) and mac-unit seed 21 (sum_frac 37 of
    40 bits: the merge bench's random sums reached 300, outside the sum's format) and lad-md seed
    29 (max_positions 11: the corner steps drew candidate positions up to the step count, 98 in a
    4-bit field); bench bugs, now fixed."""
    report = fuzz_one(block, seed=seed, vectors=100)
    assert report["mismatches"] == 0 and report["vectors"] >= 100, report


def test_resume_reuses_only_results_of_the_same_config_verilog_and_bench():
    """A recorded result is reused when its stamp (config, Verilog, bench) is today's; a result
    recorded on other Verilog is run again."""
    job = ("config", "sram", 1, 100)
    _, first, err, _ = _job(job)
    assert err is None and first["mismatches"] == 0 and first["vectors"] >= 100
    record = {"kind": "config", "block": "sram", "seed": 1, "vectors_asked": 100, "passed": True,
              "vectors": first["vectors"], "stamp": first["stamp"], "seconds": 1.0}
    _, again, _, _ = _job(job, record)
    assert again.get("reused") and again["stamp"] == first["stamp"]
    stale = {**record, "stamp": {**first["stamp"], "verilog": "0" * 16}}
    _, rerun, _, _ = _job(job, stale)
    assert not rerun.get("reused") and rerun["stamp"] == first["stamp"] and rerun["vectors"] >= 100


@pytest.mark.parametrize("block", list(BLOCKS))
def test_draws_replay_and_validate(block):
    a, _ = random_config(block, random.Random(f"{block}:7"))
    b, _ = random_config(block, random.Random(f"{block}:7"))
    assert a == b
    a.validate()


@pytest.mark.parametrize("block", ["vpu", "sfm", "sram", "mac-unit", "dense", "lad-tile"])
def test_invalid_draws_fail_with_one_line(block, capsys):
    """The first random draw that validate() rejects is refused by `ladmac verilog` with exit
    code 2 and one line naming the problem."""
    rng, cls = random.Random(f"{block}:invalid"), get_block(block).config_class
    for _ in range(2000):
        values = draw_raw(block, rng)
        try:
            cls(**values)
        except ConfigError as err:
            message = str(err)
            break
    else:
        pytest.fail(f"no invalid {block} draw")
    argv = ["verilog", block, "-o", "/dev/null"]
    for name, value in values.items():
        argv += ["--set", f"{name}={value}"]
    assert ladmac_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("ladmac: error:") and message in err, err
