"""Every block the generator can emit: its config class, presets and component."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from amaranth.back import verilog

from golden import mac_unit as golden_mac, sfm as golden_sfm, sram as golden_sram, vpu as golden_vpu
from golden.errors import ConfigError


# Verilator lint waivers for Amaranth's output (the verified set in ARCHITECTURE.md).
VERILATOR_WAIVERS = ["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE", "-Wno-CASEOVERLAP",
                     "-Wno-UNSIGNED", "-Wno-CMPCONST", "-Wno-UNOPTFLAT"]


@dataclass(frozen=True)
class Block:
    name: str
    summary: str
    config_class: type
    presets: dict
    build: Callable  # config -> wiring.Component


def _vpu(cfg):
    from .lib.vpu import Vpu
    return Vpu(cfg)


def _sfm(cfg):
    from .lib.sfm import Sfm
    return Sfm(cfg)


def _sram(cfg):
    from .lib.sram import SramBank
    return SramBank(cfg)


def _mac_unit(cfg):
    from .mac.unit import MacUnit
    return MacUnit(cfg)


def _mac_match(cfg):
    from .mac.match import MatchUnit
    return MatchUnit(cfg)


def _mac_merge(cfg):
    from .mac.merge import MergeUnit
    return MergeUnit(cfg)


BLOCKS: dict[str, Block] = {
    "vpu": Block("vpu", "vector unit: DOT / SQDIST over beats, AXPY lanes", golden_vpu.VpuConfig,
                 golden_vpu.PRESETS, _vpu),
    "sfm": Block("sfm", "special functions: PWL exp with interval index, reciprocal", golden_sfm.SfmConfig,
                 golden_sfm.PRESETS, _sfm),
    "sram": Block("sram", "SRAM bank: memory behind write / read request / read response streams",
                  golden_sram.SramConfig, golden_sram.PRESETS, _sram),
    "mac-match": Block("mac-match", "MAC match: ring windows of pre-RoPE queries, best L2 match",
                       golden_mac.MacUnitConfig, golden_mac.PRESETS, _mac_match),
    "mac-merge": Block("mac-merge", "MAC merge: online-softmax merge and removal of attention states",
                       golden_mac.MacUnitConfig, golden_mac.PRESETS, _mac_merge),
    "mac-unit": Block("mac-unit", "MAC unit: match + merge behind stream ports", golden_mac.MacUnitConfig,
                      golden_mac.PRESETS, _mac_unit),
}


def get_block(name: str) -> Block:
    if name not in BLOCKS:
        raise ConfigError(f"unknown block '{name}' (known: {', '.join(BLOCKS)})")
    return BLOCKS[name]


def make_config(name: str, overrides: dict[str, str] | None = None, preset: str | None = None):
    """Config of block ``name``: its defaults (or a named preset) with ``NAME=VALUE`` overrides."""
    block = get_block(name)
    values: dict[str, str] = {}
    if preset is not None:
        if preset not in block.presets:
            raise ConfigError(f"unknown preset '{preset}' for {name} (known: {', '.join(block.presets)})")
        values = {k: str(v) for k, v in block.presets[preset].to_dict().items()}
    values.update(overrides or {})
    return block.config_class.from_overrides(values)


def generate_verilog(name: str, cfg) -> str:
    """Verilog text of block ``name`` at ``cfg``; the top module is called ``top``."""
    block = get_block(name)
    component = block.build(cfg)
    return verilog.convert(component, name="top", emit_src=False)
