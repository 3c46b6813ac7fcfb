"""Every block the generator can emit, one :class:`Block` record each: config class, presets,
component builder and the cocotb testbench that checks it, and the config of a block by name
(docs/architecture.md). :mod:`hdl.generate` turns a block and a config into Verilog."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

from golden import dense as golden_dense, lad_tile as golden_lad_tile, mac_decode as golden_mac_decode, mac_unit as golden_mac, sfm as golden_sfm, sram as golden_sram, vpu as golden_vpu
from golden.errors import ConfigError


@dataclass(frozen=True)
class Block:
    name: str
    summary: str
    config_class: type
    presets: dict
    build: Callable  # config -> wiring.Component
    source: str      # the file that defines the block's component
    testbench: str   # the cocotb module that checks the block against its golden model
    tests: tuple     # the pytest arguments that select the block's RTL tests
    one_head: bool = False   # serves one query head (group 1 only; a tile per KV group has one per head)

    @property
    def smallest_preset(self) -> str:
        """The preset quickest to build and simulate (for smoke checks)."""
        return next((p for p in ("tiny", "small", "narrow") if p in self.presets), "default")


def _block(name, summary, config_module, config_class, component, tests, one_head=False) -> Block:
    """One row of the table: ``component`` is ``"hdl.module:Class"`` (imported when built), the
    testbench is ``testbenches.tb.tb_<name>``, ``tests`` a pytest selection under testbenches/
    (``"test_mac_unit.py -k match"``). A ``one_head`` block (hdl.lad.common.require_one_head) has
    its config class's presets at group 1 (the module a tile of that preset builds for each head), the
    default included; a preset that only differs from an earlier one by its group is left out."""
    module_name, class_name = component.split(":")

    def build(cfg):
        module = importlib.import_module(module_name)
        return getattr(module, class_name)(cfg)

    file, _, keyword = tests.partition(" -k ")
    presets = {}
    for k, c in config_module.PRESETS.items():   # a one-head block: each preset's module, as the tile builds it
        if one_head:
            c = replace(c, group=1)
            if c in presets.values():
                continue
        presets[k] = c
    return Block(name, summary, getattr(config_module, config_class), presets, build,
                 module_name.replace(".", "/") + ".py", f"testbenches.tb.tb_{name.replace('-', '_')}",
                 (f"testbenches/{file}", *(("-k", keyword) if keyword else ())), one_head)


BLOCKS: dict[str, Block] = {b.name: b for b in [
    _block("vpu", "vector unit: DOT / SQDIST over beats, AXPY lanes", golden_vpu, "VpuConfig", "hdl.lib.vpu:Vpu", "test_vpu.py"),
    _block("sfm", "special functions: PWL exp with interval index, reciprocal", golden_sfm, "SfmConfig",
           "hdl.lib.sfm:Sfm", "test_sfm.py"),
    _block("sram", "SRAM bank: memory behind write / read request / read response streams", golden_sram,
           "SramConfig", "hdl.lib.sram:SramBank", "test_sram.py"),
    _block("mac-match", "MAC match: ring windows of pre-RoPE queries, best L2 match", golden_mac, "MacUnitConfig",
           "hdl.mac.match:MatchUnit", "test_mac_unit.py -k match"),
    _block("mac-merge", "MAC merge: online-softmax merge and removal of attention states", golden_mac,
           "MacUnitConfig", "hdl.mac.merge:MergeUnit", "test_mac_unit.py -k merge"),
    _block("mac-unit", "MAC unit: match + merge behind stream ports", golden_mac, "MacUnitConfig",
           "hdl.mac.unit:MacUnit", "test_mac_unit.py -k mac_unit_rtl"),
    _block("mac-decode", "MAC decode engine: match, entry, band/tail attention, merge, downdate for one head's step",
           golden_mac_decode, "MacDecodeConfig", "hdl.mac.decode:MacDecodeEngine",
           "test_mac_decode_rtl.py"),
    _block("dense", "dense PWL attention baseline: reads every key and value (LAD's reference point)",
           golden_dense, "DenseConfig", "hdl.lad.dense:DenseAttention",
           "test_dense.py -k rtl"),
    _block("lad-tile", "LAD tile: EAS, APID, MD, AC, VPU pool, SFM and SRAM banks for a KV group's decode (or one head's)",
           golden_lad_tile, "LadTileConfig", "hdl.lad.tile:LadTile", "test_lad_tile.py -k rtl_equals"),
    _block("lad-eas", "LAD EAS: directional centers, the new key's center and rho, approximate scores",
           golden_lad_tile, "LadTileConfig", "hdl.lad.eas:Eas", "test_lad_modules.py -k lad_eas"),
    _block("lad-apid", "LAD APID: per-position metadata, max approximate score, candidates, mode counters",
           golden_lad_tile, "LadTileConfig", "hdl.lad.apid:Apid", "test_lad_modules.py -k lad_apid"),
    _block("lad-md", "LAD MD: exact scores of candidates, intervals, verdicts, correction commands",
           golden_lad_tile, "LadTileConfig", "hdl.lad.md:Md", "test_lad_modules.py -k lad_md", one_head=True),
    _block("lad-ac", "LAD AC: caches A-F, N and Z, corrections, cache updates, o = N / Z", golden_lad_tile,
           "LadTileConfig", "hdl.lad.ac:Ac", "test_lad_modules.py -k lad_ac or lane_file", one_head=True),
]}


def get_block(name: str) -> Block:
    if name not in BLOCKS:
        raise ConfigError(f"unknown block '{name}' (known: {', '.join(BLOCKS)})")
    return BLOCKS[name]


def make_config(name: str, overrides: dict[str, str] | None = None, preset: str | None = None):
    """Config of block ``name``: its defaults (or a named preset) with ``NAME=VALUE`` overrides."""
    block = get_block(name)
    if preset is not None and preset not in block.presets:
        raise ConfigError(f"unknown preset '{preset}' for {name} (known: {', '.join(block.presets)})")
    if preset is not None:
        base = block.presets[preset]
    else:   # its defaults; a one-head block's at group 1
        base = replace(block.config_class(), group=1) if block.one_head else block.config_class()
    return base.with_overrides(overrides or {})
