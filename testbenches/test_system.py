"""The system model (synth/system, ``ladmac system``): its per-step counts are the bit-accurate
models' own statistics from a short real SmolLM2 run (nothing derived twice); the model's shapes
are the models'; the whole-model figures at the defaults are sane and non-trivial; bad input
exits 2 with one line. The cycle agreement with the RTL: benchmarks/system_cycles.py."""
import json
import os

import pytest

from golden.lad_tile import ONE_HEAD_V2, LadTileConfig
from golden.llm.activity import activity
from golden.mac_decode import MacDecodeConfig
from hdl.lad.common import sram_bits
from synth.system.cli import DEFAULT_CONTEXTS
from synth.system.engines import dense_engine, lad_engine, load_record, mac_engine, record_path
from synth.system.model import decode_step, default_tiles
from synth.system.shapes import SHAPES, shape_from_config
from synth.system.tech import Tech


def per_layer_means(ctl, key):
    """Each layer's mean per decode step of one statistic, straight from the controller."""
    steps = ctl.layer_steps
    return [sum(s["layers"][layer][key] for s in steps) / len(steps) for layer in range(30)]


@pytest.mark.parametrize("tile", [LadTileConfig(), LadTileConfig(**ONE_HEAD_V2)], ids=["group", "one-head"])
def test_lad_counts_are_the_bit_accurate_models(smollm2, tile):
    from golden.llm.runs import teacher_forced
    ctl, ids = smollm2
    teacher_forced(ctl, ids[:41], "lad-tile", 0, tile=tile, progress=False)
    rec = activity(ctl.layer_steps, 16, engine="lad-tile", config=tile.to_dict())
    shape = SHAPES["smollm2"]
    eng = lad_engine(shape, 40, rec)
    assert [s.cycles for s in eng.layers] == pytest.approx(per_layer_means(ctl, "tile_cycles"))
    kv = per_layer_means(ctl, "kv_beats")
    assert [s.kv_bytes for s in eng.layers] == pytest.approx([b * tile.lanes * tile.kv_width / 8 for b in kv])
    assert min(kv) > 0 and ctl.totals["candidates"] > 0
    # a tile per KV group: 3 tiles a layer, each holding its group's state (one center table)
    assert eng.heads_per_tile == tile.group and default_tiles(eng, shape) == shape.q_heads // tile.group
    assert eng.state_bits_per_head * tile.group < sram_bits(tile)


def test_mac_counts_are_the_bit_accurate_models(smollm2):
    from golden.llm.runs import teacher_forced
    ctl, ids = smollm2
    cfg = MacDecodeConfig(window=16, band=4, min_context=20, sinks=0, full_layers="", max_positions=256)
    teacher_forced(ctl, ids[:49], "mac-decode", 8, mac=cfg, progress=False)
    rec = activity(ctl.layer_steps, 16, engine="mac-decode", config=cfg.to_dict())
    eng = mac_engine(SHAPES["smollm2"], 48, rec)
    assert [s.cycles for s in eng.layers] == pytest.approx(per_layer_means(ctl, "rtl_cycles"))
    assert [s.kv_bytes for s in eng.layers] == pytest.approx(per_layer_means(ctl, "kv_bytes"))
    assert [s.stream_bytes for s in eng.layers] == pytest.approx(per_layer_means(ctl, "entry_bytes"))
    assert ctl.totals["hits"] > 0 and ctl.totals["rtl_cycles"] > ctl.totals["engine_cycles"] > 0


def test_smollm2_shape_is_the_models(smollm2):
    ctl, _ = smollm2
    c, s = ctl.model.config, SHAPES["smollm2"]
    assert (s.layers, s.hidden, s.q_heads, s.kv_heads, s.intermediate, s.vocab) == \
        (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
         c.vocab_size)
    params = sum(p.numel() for p in ctl.model.parameters())          # tied: the LM head is the embedding
    norms = (2 * s.layers + 1) * s.hidden
    assert s.step_weights == params - norms


def test_whole_model_at_4096_on_the_recorded_activity():
    tech, shape = Tech(), SHAPES["smollm2"]
    dram = tech.dram("ddr4-3200")
    lad = lad_engine(shape, 4096, load_record("lad-tile", 4096))
    dense = dense_engine(shape, 4096)
    r_dense = decode_step(dense, shape, tech, dram, None, "resident")
    r_res = decode_step(lad, shape, tech, dram, None, "resident")
    r_str = decode_step(lad, shape, tech, dram, None, "streamed")
    assert (r_dense.tiles, r_res.tiles) == (9, 3)                       # a LAD tile per KV group
    for r in (r_dense, r_res, r_str):
        assert r.tokens_per_s > 1 and all(v > 0 for k, v in r.energy.items() if k != "sram" or r.engine != "dense")
        # weights alone bound the step from below: every weight crosses the DRAM once per token
        assert r.seconds > shape.step_weights * 2 / (dram.bandwidth_gb_s * 1e9)
    assert r_res.attention_seconds < r_dense.attention_seconds          # LAD reads a fraction of the keys
    assert r_res.sram_mib > 20 * r_str.sram_mib                          # every head's table on chip
    assert r_str.dram_bytes > r_res.dram_bytes                           # the tables come from DRAM


def test_a_shape_without_groups_of_three_gets_one_head_lad_tiles(capsys):
    from ladmac_cli import main
    assert main(["system", "--model", "llama2-7b", "--contexts", "4096", "--dram", "hbm2e",
                 "--engines", "lad-tile"]) == 0
    out = capsys.readouterr().out
    assert "32 lad-tile attention tiles" in out and "one-head records" in out


def test_shape_from_a_transformers_config(tmp_path):
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 11008,
           "vocab_size": 32000, "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    s = shape_from_config(path)
    assert (s.head_dim, s.kv_heads) == (128, 32) and s.layer_weights == SHAPES["llama2-7b"].layer_weights


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--dram", "ddr9"], "unknown dram 'ddr9'"),
    (["--contexts", "3000"], "no lad-tile activity record at context 3000"),
    (["--contexts", "40000"], "outside 2..8192"),
    (["--model", "{bad_json}"], "is not a JSON model config"),
    (["--model", "{no_layers}"], "lacks a positive integer num_hidden_layers"),
    (["--tiles", "0"], "--tiles must be positive"),
    (["--residency", "cached"], "unknown residency 'cached'"),
    (["--node", "3"], "no scaling to 3 nm"),
    (["--model", "llama2-7b", "--contexts", "4096", "--activity", "{group_record}"],
     "serves a KV group of 3 query heads"),
])
def test_system_bad_input_exits_2_with_one_line(argv, fragment, tmp_path, capsys):
    from ladmac_cli import main
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "nolayers.json").write_text(json.dumps({"hidden_size": 64}))
    files = {"bad_json": str(tmp_path / "bad.json"), "no_layers": str(tmp_path / "nolayers.json"),
             "group_record": str(record_path("lad-tile", 4096))}
    code = main(["system", *[a.format(**files) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and len(err.strip().splitlines()) == 1 and err.startswith("ladmac: error: "), err


def test_system_defaults_print_every_engine_and_residency(capsys, tmp_path):
    from ladmac_cli import main
    out = tmp_path / "system.json"
    assert main(["system", "--out", str(out), "--plot", str(tmp_path)]) == 0
    res = json.loads(out.read_text())
    combos = {(r["context"], r["engine"], r["residency"], r["dram"]) for r in res["rows"]}
    assert len(combos) == len(DEFAULT_CONTEXTS.split(",")) * 3 * 2 * 2
    assert all(r["tokens_per_s"] > 0 and r["energy_per_token_j"] > 0 for r in res["rows"])
    assert len(res["plots"]) == 4 and all(os.path.getsize(p) > 10_000 for p in res["plots"])
    text = capsys.readouterr().out
    assert "ddr4-3200" in text and "hbm2e" in text and "mac-decode" in text
