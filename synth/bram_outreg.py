"""Move the register after a block RAM's read port into the DP16KD's own output register.

Yosys maps a synchronous read port onto a DP16KD in ``NOREG`` mode and leaves the register
that the RTL puts after it (``hdl/lib/sram.py``'s second read stage) in the fabric: the path
from the RAM's output pins (5.8 ns clock-to-out at speed 6) to that register then limits the
clock. This pass, run on Yosys's JSON netlist before nextpnr, switches a read port to
``REGMODE = OUTREG`` when every used output bit of that port drives exactly one fabric
flip-flop and nothing else, all of them on the RAM port's clock, with one shared clock
enable (it becomes the port's ``OCE``) and no set/reset: the DP16KD's output register then
does what those flip-flops did (same enable, same zero power-up, reset tied off), and the
flip-flops are removed.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def _param(cell: dict, name: str, default: str = "") -> str:
    return str(cell["parameters"].get(name, default)).strip()   # Yosys marks strings with a trailing space


def _int_param(cell: dict, name: str, default: int) -> int:
    value = cell["parameters"].get(name)
    if value is None:
        return default
    return int(value, 2) if isinstance(value, str) and set(value) <= {"0", "1"} else int(value)


def _absorbable(ram: dict, port: str, loads: dict, cells: dict):
    """The (DO pin, flip-flop name) pairs and the clock enable of ``port`` ("A"/"B"), or None."""
    if _param(ram, f"REGMODE_{port}") != "NOREG" or ram["connections"].get(f"RST{port}") != ["0"]:
        return None
    clock = ram["connections"].get(f"CLK{port}")
    pairs, enables = [], set()
    for pin, bits in ram["connections"].items():
        if not pin.startswith(f"DO{port}") or not isinstance(bits[0], int) or not loads[bits[0]]:
            continue
        if len(loads[bits[0]]) != 1:
            return None
        name, load_pin = loads[bits[0]][0]
        ff = cells.get(name)
        if ff is None or ff["type"] != "TRELLIS_FF" or load_pin != "DI":
            return None
        c = ff["connections"]
        if (c.get("CLK") != clock or _param(ff, "CLKMUX", "CLK") != "CLK" or _param(ff, "GSR") != "DISABLED"
                or c.get("LSR", ["0"]) != ["0"] or _param(ff, "LSRMUX", "LSR") != "LSR"
                or _param(ff, "REGSET", "RESET") != "RESET" or _param(ff, "CEMUX", "CE") not in ("CE", "1")):
            return None
        enables.add(tuple(c["CE"]) if _param(ff, "CEMUX", "CE") == "CE" else ("1",))
        pairs.append((pin, name))
    if not pairs or len(enables) != 1:
        return None
    return pairs, list(enables.pop())


def absorb(netlist: Path) -> int:
    """Rewrite ``netlist`` (Yosys JSON) in place; returns how many flip-flops were absorbed."""
    design = json.loads(netlist.read_text())
    absorbed = 0
    for module in design["modules"].values():
        cells = module.get("cells", {})
        loads = defaultdict(list)            # bit -> [(cell, pin)] reading it; ports count as readers
        for name, cell in cells.items():
            for pin, bits in cell["connections"].items():
                if cell.get("port_directions", {}).get(pin) != "output":
                    for bit in bits:
                        loads[bit].append((name, pin))
        for port in module.get("ports", {}).values():
            for bit in port["bits"]:
                loads[bit].append(("", "port"))
        for ram in [c for c in cells.values() if c["type"] == "DP16KD"]:
            if _int_param(ram, "DATA_WIDTH_A", 18) == 36:
                continue                     # pseudo dual port: both ports' pins are one word
            for port in "AB":
                found = _absorbable(ram, port, loads, cells)
                if found is None:
                    continue
                pairs, enable = found
                ram["parameters"][f"REGMODE_{port}"] = "OUTREG"
                ram["connections"][f"OCE{port}"] = enable
                for pin, ff_name in pairs:
                    ram["connections"][pin] = cells.pop(ff_name)["connections"]["Q"]
                absorbed += len(pairs)
    netlist.write_text(json.dumps(design))
    return absorbed
