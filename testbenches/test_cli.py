"""The ladmac CLI: listing, Verilog emission (lint clean under Verilator) and bad input."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hdl.registry import BLOCKS
from ladmac_cli import main


def test_blocks_lists_every_block_and_parameter(capsys):
    assert main(["blocks"]) == 0
    out = capsys.readouterr().out
    for name, block in BLOCKS.items():
        assert f"{name}:" in out
        for param, _, _ in block.config_class.describe():
            assert param in out


@pytest.mark.parametrize("block", list(BLOCKS))
def test_verilog_is_lint_clean(block, tmp_path, capsys):
    out = tmp_path / f"{block}.v"
    assert main(["verilog", block, "-o", str(out)]) == 0  # runs verilator --lint-only
    text = out.read_text()
    assert "module top(" in text and "clk" in text
    assert "lint clean" in capsys.readouterr().err


def test_verilog_with_overrides_changes_the_design(tmp_path):
    a, b = tmp_path / "a.v", tmp_path / "b.v"
    assert main(["verilog", "vpu", "-o", str(a)]) == 0
    assert main(["verilog", "vpu", "--set", "lanes=2", "--set", "in_width=8", "--set", "acc_width=24",
                 "--set", "axpy_shift=7", "-o", str(b)]) == 0
    assert len(b.read_text()) < len(a.read_text())


@pytest.mark.parametrize("argv, fragment", [
    (["verilog", "nope"], "unknown block 'nope'"),
    (["verilog", "vpu", "--set", "bogus=1"], "unknown parameter 'bogus'"),
    (["verilog", "vpu", "--set", "lanes=0"], "lanes must be 1..64"),
    (["verilog", "vpu", "--set", "lanes=many"], "expects int"),
    (["verilog", "vpu", "--set", "lanes"], "NAME=VALUE"),
    (["verilog", "sfm", "--set", "cutoff=-100"], "cutoff"),
    (["verilog", "sram", "--preset", "huge"], "unknown preset 'huge'"),
    (["frobnicate"], "invalid choice"),
    (["sim", "vpu", "--vectors", "-5"], "--vectors must be positive, got -5"),
    (["sim", "vpu", "--vectors", "0"], "--vectors must be positive, got 0"),
    (["sim", "vpu", "--vectors", "many"], "invalid int value: 'many'"),
    (["eval", "lad", "--prompts", "-1"], "--prompts must be >= 0, got -1"),
    (["eval", "mac", "--new-tokens", "0"], "--new-tokens must be positive, got 0"),
    (["eval", "mac", "--set", "full_layers=20-14"], "full_layers must be layer numbers and ranges"),
    (["eval", "mac", "--set", "full_layers=3-"], "full_layers must be layer numbers and ranges"),
    (["eval", "mac", "--hardware", "--set", "full_layers=29-30"], "SmolLM2 has layers 0..29"),
    (["eval", "lad", "--context", "-3"], "--context must be >= 0, got -3"),
])
def test_bad_input_exits_2_with_one_line(argv, fragment, capsys):
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1, err


def test_console_script_exit_code():
    done = subprocess.run([sys.executable, "-m", "ladmac_cli", "verilog", "vpu", "--set", "lanes=-3"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["ladmac: error: VpuConfig: lanes must be 1..64, got -3"]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("block", list(BLOCKS))
def test_every_block_emits_and_simulates_from_the_cli(block, tmp_path, capsys):
    """Each block in `ladmac blocks`: Verilog and a bit-exact Verilator check at its smallest preset."""
    preset = BLOCKS[block].smallest_preset
    assert main(["verilog", block, "--preset", preset, "-o", str(tmp_path / "top.v")]) == 0
    assert main(["sim", block, "--preset", preset, "--vectors", "4", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    vectors, mismatches = (int(w) for w in
                           re.search(r": (\d+) vectors, (\d+) mismatches", out).groups())
    assert vectors > 0 and mismatches == 0, out


@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("command", ["verilog", "sim", "synth"])
def test_every_block_rejects_a_bad_set_in_one_line(block, command, capsys):
    code = main([command, block, "--set", "no_such_parameter=1"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown parameter 'no_such_parameter'" in err
    assert len(err.strip().splitlines()) == 1, err


def test_sim_waves_writes_an_fst_waveform(capsys):
    assert main(["sim", "vpu", "--preset", "narrow", "--vectors", "3", "--waves"]) == 0
    out = capsys.readouterr().out
    path = Path(re.search(r"waveform: (\S+)", out).group(1))
    assert path.suffix == ".fst" and path.stat().st_size > 100


def test_eval_names_the_text_file_it_read(tmp_path, capsys):
    """`--data OTHER.txt`: the table and the JSON name that file; only the repository's WikiText-2
    file (the default, or named by path) is called WikiText-2."""
    from golden.llm.data import WIKITEXT, describe_text
    from golden.paths import DATA_ROOT
    assert describe_text(None) == f"WikiText-2 test ({(DATA_ROOT / WIKITEXT).resolve()})"
    assert describe_text(DATA_ROOT / WIKITEXT) == describe_text(None)
    other = tmp_path / "other.txt"
    other.write_text(" ".join(f"The river number {i} runs past the old mill and into the sea ." for i in range(40)))
    out = tmp_path / "r.json"
    assert main(["eval", "lad", "--data", str(other), "--tokens", "4", "--prompts", "0", "--variants", "lad",
                 "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"tokens after 0 context) on {other.resolve()}" in text
    assert "WikiText-2" not in text
    assert json.loads(out.read_text())["data"] == str(other.resolve())
