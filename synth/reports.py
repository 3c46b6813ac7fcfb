"""Parsers for Yosys ``stat -json`` and nextpnr ``--report`` output, and area summaries.

* ``parse_yosys_stat``: ECP5 cells of the core module and of the whole design.
* ``parse_nextpnr``: post-place utilisation, Fmax per clock and the critical reg-to-reg
  path of the core clock (start/end cells, logic levels, nets, delay split, RTL sources).
* ``parse_generic``: technology-independent cell counts, memory bits and a gate-equivalent
  (NAND2) estimate, with the memory share of the estimated area.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

# Primitive cell -> NAND2 gate equivalents (typical standard-cell ratios). Used only for
# the area *share* estimate in the docs, never as an absolute area.
GE_WEIGHTS = {
    "$_NOT_": 0.67, "$_BUF_": 0.67, "$_NAND_": 1.0, "$_NOR_": 1.0, "$_AND_": 1.33, "$_OR_": 1.33,
    "$_ANDNOT_": 1.33, "$_ORNOT_": 1.33, "$_XOR_": 2.33, "$_XNOR_": 2.33, "$_MUX_": 2.33,
    "$_AOI3_": 1.33, "$_OAI3_": 1.33, "$_AOI4_": 1.67, "$_OAI4_": 1.67, "$_NMUX_": 2.0,
}
GE_FF = 4.67          # D flip-flop (plus ~1 GE for a reset or enable variant)
GE_PER_SRAM_BIT = 0.25  # compiled SRAM incl. periphery, e.g. LAD's 1.5 MB at 1.596 mm^2 = 0.127 um^2/bit
                        # against a ~0.5 um^2 NAND2 (28 nm class); an assumption, stated in the docs

# ECP5 cell types that occupy LUT4 sites: CCU2C is two LUT4 + carry; a 16x4 distributed
# RAM (TRELLIS_DPR16X4) takes the LUTs of a slice pair.
LUT_WEIGHT = {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 4}


def _strip(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


def _module_cells(stat: dict, name: str) -> dict:
    for mod, info in stat["modules"].items():
        if _strip(mod) == name:
            return dict(info.get("num_cells_by_type", {}))
    raise KeyError(name)


def ecp5_summary(cells: dict) -> dict:
    """LUT4 (sites, carries counted as two), FF, DP16KD, MULT18X18D, ALU54B and the raw cells."""
    return {"LUT4": sum(cells.get(t, 0) * w for t, w in LUT_WEIGHT.items()),
            "FF": cells.get("TRELLIS_FF", 0), "DP16KD": cells.get("DP16KD", 0),
            "MULT18X18D": cells.get("MULT18X18D", 0), "ALU54B": cells.get("ALU54B", 0),
            "cells": {k: v for k, v in sorted(cells.items()) if not k.startswith("$scopeinfo") and "." not in k}}


def parse_yosys_stat(path: Path, core_module: str) -> dict:
    """``{"core": cells of the core module, "total": cells of the whole design}`` (raw type counts)."""
    stat = json.loads(Path(path).read_text())
    try:
        core = _module_cells(stat, core_module)
    except KeyError:
        raise RuntimeError(f"yosys stat has no module '{core_module}': the harness lost the core "
                           f"(modules: {', '.join(_strip(m) for m in stat['modules'])})") from None
    total = dict(stat["design"].get("num_cells_by_type", {}))
    return {"core": {k: v for k, v in core.items() if not k.startswith("$scopeinfo")},
            "total": {k: v for k, v in total.items() if not k.startswith("$scopeinfo") and "." not in k}}


# -- nextpnr ------------------------------------------------------------------------------
_FMAX_LOG = re.compile(r"Max frequency for clock '([^']+)': ([0-9.]+) MHz")


def _is_clock(name: str) -> bool:
    return name.startswith("posedge") or name.startswith("negedge")


def _source(paths: list[str]) -> list[str]:
    out = []
    for s in paths or []:
        if "/share/" in s or "site-packages/amaranth/" in s:
            continue
        m = re.search(r"(hdl|synth|golden)/[^:]+:\d+", s)
        out.append(m.group(0) if m else s)
    return out


def _owner(cell: str) -> str:
    if cell.startswith("harness.core."):
        return "core"
    return "harness"


def summarise_path(path: list[dict]) -> dict:
    """Start/end cells, levels, nets and delay split of one nextpnr critical path."""
    total = sum(seg["delay"] for seg in path)
    split = {"clk-to-q": 0.0, "logic": 0.0, "routing": 0.0, "setup": 0.0}
    nets, sources, cells = [], [], []
    for seg in path:
        kind = seg["type"]
        split[kind] = split.get(kind, 0.0) + seg["delay"]
        cell = seg["from"]["cell"]
        if not cells or cells[-1] != cell:
            cells.append(cell)
        if kind == "routing":
            nets.append({"net": seg.get("net", "?"), "ns": round(seg["delay"], 3)})
            for src in _source(seg.get("sources")):
                if src not in sources:
                    sources.append(src)
    start, end = path[0]["from"], path[-1]["to"]
    return {
        "delay_ns": round(total, 3),
        "from": f"{start['cell']}.{start['port']}", "to": f"{end['cell']}.{end['port']}",
        "from_owner": _owner(start["cell"]), "to_owner": _owner(end["cell"]),
        "logic_levels": sum(1 for seg in path if seg["type"] == "logic"),
        "split_ns": {k: round(v, 3) for k, v in split.items() if v},
        "cells": cells, "nets": nets, "sources": sources,
    }


def parse_nextpnr(report_path: Path, log_text: str = "") -> dict:
    """Utilisation, Fmax of every clock and the critical reg-to-reg path of the core clock."""
    rep = json.loads(Path(report_path).read_text())
    util = {k: v for k, v in rep.get("utilization", {}).items() if v.get("used")}
    clocks = {name: {"achieved_mhz": round(v["achieved"], 2), "constraint_mhz": v.get("constraint")}
              for name, v in rep.get("fmax", {}).items()}
    if not clocks:  # fall back on the log (last value per clock wins: post-route)
        for name, mhz in _FMAX_LOG.findall(log_text):
            clocks[name] = {"achieved_mhz": float(mhz), "constraint_mhz": None}
    fmax = min((c["achieved_mhz"] for c in clocks.values()), default=0.0)
    reg2reg = [p for p in rep.get("critical_paths", []) if _is_clock(p["from"]) and _is_clock(p["to"])]
    crit = None
    if reg2reg:
        worst = max(reg2reg, key=lambda p: sum(seg["delay"] for seg in p["path"]))
        crit = {"clock": worst["from"], **summarise_path(worst["path"])}
    return {"utilisation": util, "clocks": clocks, "fmax_mhz": fmax, "critical_path": crit}


# -- generic ------------------------------------------------------------------------------
def _param_int(value) -> int:
    if isinstance(value, int):
        return value
    text = str(value)
    return int(text, 2) if set(text) <= {"0", "1"} else int(text)


def parse_generic(stat_path: Path, netlist_path: Path) -> dict:
    """Cells by type of the flattened generic netlist, FFs, memory bits and a GE estimate."""
    stat = json.loads(Path(stat_path).read_text())
    cells = {k: v for k, v in stat["design"].get("num_cells_by_type", {}).items() if not k.startswith("$scopeinfo")}
    netlist = json.loads(Path(netlist_path).read_text())
    mem_bits, memories = 0, []
    for mod in netlist["modules"].values():
        for name, cell in mod.get("cells", {}).items():
            if cell["type"].startswith("$mem"):
                size, width = _param_int(cell["parameters"]["SIZE"]), _param_int(cell["parameters"]["WIDTH"])
                mem_bits += size * width
                memories.append({"name": name, "depth": size, "width": width})
    ffs = sum(v for k, v in cells.items() if "DFF" in k.upper() or "DLATCH" in k.upper())
    logic = sum(v for k, v in cells.items() if k in GE_WEIGHTS)
    ge_logic = sum(GE_WEIGHTS[k] * v for k, v in cells.items() if k in GE_WEIGHTS)
    ge_ff = GE_FF * ffs
    ge_mem = GE_PER_SRAM_BIT * mem_bits
    total = ge_logic + ge_ff + ge_mem
    return {"cells": dict(sorted(cells.items())), "num_cells": sum(v for k, v in cells.items() if not k.startswith("$mem")),
            "logic_cells": logic, "ff": ffs, "memory_bits": mem_bits, "memories": memories,
            "ge": {"logic": round(ge_logic), "ff": round(ge_ff), "memory": round(ge_mem), "total": round(total),
                   "memory_share": round(ge_mem / total, 3) if total else 0.0}}


# -- diagnosis ----------------------------------------------------------------------------
_SIM_ATTRS = ("blackbox", "whitebox", "lib_whitebox", "abc9_box", "abc9_flop")


def cell_types(netlist_path: Path) -> dict:
    """Flattened cell name (as nextpnr prints it) -> primitive type, from Yosys's JSON netlist;
    descends only into the design's own modules, not into the vendor cells' simulation models."""
    mods = json.loads(Path(netlist_path).read_text())["modules"]
    top = next((n for n, m in mods.items() if m.get("attributes", {}).get("top")), "top")
    out = {}

    def own(kind: str) -> bool:
        attrs = mods.get(kind, {}).get("attributes", {})
        return kind in mods and not kind.startswith("$") and not any(a in attrs for a in _SIM_ATTRS)

    def walk(mod: str, prefix: str, depth: int = 0):
        for name, cell in mods[mod].get("cells", {}).items():
            kind = cell["type"]
            if own(kind) and mods[kind].get("cells") and depth < 8:
                walk(kind, prefix + name + ".", depth + 1)
            else:
                out[prefix + name] = kind.split("\\")[-1]
    walk(top, "")
    return out


def annotate_path(crit: dict | None, types: dict) -> None:
    """Adds ``cell_types`` (type -> count on the path) and a ``diagnosis`` to a path summary."""
    if not crit:
        return
    kinds: dict[str, int] = {}
    for cell in crit["cells"]:
        kind = types.get(cell, "?")
        kinds[kind] = kinds.get(kind, 0) + 1
    crit["cell_types"] = kinds
    crit["diagnosis"] = diagnose(crit, kinds)


def diagnose(crit: dict, kinds: dict) -> str:
    """One or two sentences: what limits this path and the usual RTL fix."""
    split = crit["split_ns"]
    notes = []
    if crit["from_owner"] == "harness" and crit["to_owner"] == "harness":
        return ("the path lies inside the register harness, not the block: the block itself is faster "
                "than this figure.")
    if kinds.get("DP16KD") and split.get("clk-to-q", 0) > 3.0:
        notes.append(f"it starts at a block RAM read port with no output register (DP16KD clk-to-q "
                     f"{split['clk-to-q']:.1f} ns, against ~0.5 ns for a fabric FF); registering the read data "
                     "once more (a second read-latency stage, or the DP16KD output register) removes it")
    if kinds.get("MULT18X18D"):
        notes.append(f"{kinds['MULT18X18D']} MULT18X18D on the path: routes into and out of the DSP column on "
                     "either side of its array; registering the multiplier's operands and product twice (one "
                     "fabric register next to the logic, one that synth/absorb.py moves into the DSP) leaves "
                     "only routing on those paths")
    carries = kinds.get("CCU2C", 0)
    if carries >= 8:
        notes.append(f"a {carries}-cell carry chain (~{2 * carries}-bit add/compare) in series with the other "
                     "logic; split the add or register its operands/result")
    luts = kinds.get("LUT4", 0) + kinds.get("PFUMX", 0) + kinds.get("L6MUX21", 0)
    if crit["logic_levels"] >= 8 and luts >= 6:
        notes.append(f"{crit['logic_levels']} logic levels ({luts} LUT/mux cells) between registers; "
                     "add a pipeline stage in the middle of this cone")
    if split.get("routing", 0) > 0.6 * crit["delay_ns"]:
        notes.append(f"routing is {100 * split['routing'] / crit['delay_ns']:.0f}% of the delay (long wires / "
                     "high fan-out); duplicating or registering the high-fan-out signal helps")
    if not notes:
        notes.append("no single dominant element; the path is a mix of logic and routing")
    return "; ".join(notes) + "."
