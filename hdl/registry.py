"""Every block the generator can emit: its config class, presets and component."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from amaranth.back import verilog

from golden import dense as golden_dense, lad_tile as golden_lad_tile, mac_unit as golden_mac, sfm as golden_sfm, sram as golden_sram, vpu as golden_vpu
from golden.errors import ConfigError


# Verilator lint waivers for Amaranth's output (the verified set in ARCHITECTURE.md).
VERILATOR_WAIVERS = ["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE", "-Wno-CASEOVERLAP",
                     "-Wno-UNSIGNED", "-Wno-CMPCONST", "-Wno-UNOPTFLAT", "-Wno-ALWNEVER"]


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


def _dense(cfg):
    from .lad.dense import DenseAttention
    return DenseAttention(cfg)


def _lad_tile(cfg):
    from .lad.tile import LadTile
    return LadTile(cfg)


def _lad_eas(cfg):
    from .lad.eas import Eas
    return Eas(cfg)


def _lad_apid(cfg):
    from .lad.apid import Apid
    return Apid(cfg)


def _lad_md(cfg):
    from .lad.md import Md
    return Md(cfg)


def _lad_ac(cfg):
    from .lad.ac import Ac
    return Ac(cfg)


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
    "dense": Block("dense", "dense PWL attention baseline: reads every key and value (LAD's reference point)",
                   golden_dense.DenseConfig, golden_dense.PRESETS, _dense),
    "lad-tile": Block("lad-tile", "LAD tile: EAS, APID, MD, AC, VPU pool, SFM and SRAM banks for one head's decode",
                      golden_lad_tile.LadTileConfig, golden_lad_tile.PRESETS, _lad_tile),
    "lad-eas": Block("lad-eas", "LAD EAS: directional centers, the new key's center and rho, approximate scores",
                     golden_lad_tile.LadTileConfig, golden_lad_tile.PRESETS, _lad_eas),
    "lad-apid": Block("lad-apid", "LAD APID: per-position metadata, max approximate score, candidates, mode counters",
                      golden_lad_tile.LadTileConfig, golden_lad_tile.PRESETS, _lad_apid),
    "lad-md": Block("lad-md", "LAD MD: exact scores of candidates, intervals, verdicts, correction commands",
                    golden_lad_tile.LadTileConfig, golden_lad_tile.PRESETS, _lad_md),
    "lad-ac": Block("lad-ac", "LAD AC: caches A-F, N and Z, corrections, cache updates, o = N / Z",
                    golden_lad_tile.LadTileConfig, golden_lad_tile.PRESETS, _lad_ac),
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


def _source_digest() -> str:
    """Hash of the generator's own sources (hdl/ and golden/): a changed file invalidates caches."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha1()
    for path in sorted([*root.glob("hdl/**/*.py"), *root.glob("golden/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def generate_verilog(name: str, cfg, cache: bool = True) -> str:
    """Verilog text of block ``name`` at ``cfg``; the top module is called ``top``.

    Conversion runs Yosys (WebAssembly) and takes seconds for the larger blocks, so the
    text is cached under build/verilog-cache by (block, config, generator sources)."""
    from golden.paths import BUILD_ROOT
    block = get_block(name)
    path = BUILD_ROOT / "verilog-cache" / f"{name}-{cfg.key()}-{_source_digest()}.v"
    if cache and path.exists():
        return path.read_text()
    text = verilog.convert(block.build(cfg), name="top", emit_src=False)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return text
