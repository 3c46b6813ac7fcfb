"""Move fabric registers into the hard blocks' own registers, on Yosys's JSON netlist before
nextpnr (Yosys maps neither the DP16KD's output register nor the MULT18X18D's input and output
registers, and nextpnr times a block without them from its slow pins).

**Block RAM.** Yosys maps a synchronous read port onto a DP16KD in ``NOREG`` mode and leaves the register
that the RTL puts after it (``hdl/lib/sram.py``'s second read stage) in the fabric: the path
from the RAM's output pins (5.8 ns clock-to-out at speed 6) to that register then limits the
clock. This pass, run on Yosys's JSON netlist before nextpnr, switches a read port to
``REGMODE = OUTREG`` when every used output bit of that port drives exactly one fabric
flip-flop and nothing else, all of them on the RAM port's clock, with one shared clock
enable (it becomes the port's ``OCE``) and no set/reset: the DP16KD's output register then
does what those flip-flops did (same enable, same zero power-up, reset tied off), and the
flip-flops are removed.

**Multipliers.** A MULT18X18D whose used product bits each drive exactly one such flip-flop
(one clock, one enable, and no reset or a synchronous one that overrides the enable, as the
DSP's ``RESETMODE SYNC`` reset does), each read only by another flip-flop, gets its output
register (``REG_OUTPUT_CLK`` on CLK0) and the flip-flops are removed: a product the RTL
registers twice (``hdl/lib/pipe.py``) leaves only routing between the DSP's pins and the
fabric register; a product registered once, with logic after it, keeps its register in the
fabric (moved, the logic would start at the DSP's pins: mac-merge's vector products 86.3 MHz
moved against 85.8 left; its SFM's, read by an adder, limited it at 90.7). The same rule for
the operands: an operand register moves into the DSP (``REG_INPUTA/B_CLK``) only when it is
loaded straight from another flip-flop (an operand the RTL registers twice) and drives nothing
but multiplier operand pins, with the product register's clock, enable and reset, and only when
the other operand's register moves too (nextpnr times a multiplier with one operand registered
as if neither were); a constant operand (every pin tied) gets its register on the same control.
An operand register read by several multipliers (one operand shared by every lane) goes into
each of them as a copy, and leaves the fabric once no reader is left;
an operand register with logic in front stays in the fabric (moving it
put that logic and its long routes into the DSP column in series with the DSP's pins:
mac-merge 65.6 MHz with both moved, against 85.8 with neither, seed 1).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def param(cell: dict, name: str, default: str = "") -> str:
    return str(cell["parameters"].get(name, default)).strip()   # Yosys marks strings with a trailing space


def _int_param(cell: dict, name: str, default: int) -> int:
    value = cell["parameters"].get(name)
    if value is None:
        return default
    return int(value, 2) if isinstance(value, str) and set(value) <= {"0", "1"} else int(value)


def _loads(module: dict) -> dict:
    """bit -> [(cell, pin)] reading it; the module's ports count as readers (cell "")."""
    loads = defaultdict(list)
    for name, cell in module.get("cells", {}).items():
        for pin, bits in cell["connections"].items():
            if cell.get("port_directions", {}).get(pin) != "output":
                for bit in bits:
                    loads[bit].append((name, pin))
    for port in module.get("ports", {}).values():
        for bit in port["bits"]:
            loads[bit].append(("", "port"))
    return loads


def _plain_ff(ff: dict | None) -> tuple | None:
    """(clock, enable, reset) of a rising-edge TRELLIS_FF that starts and resets to zero, its
    reset (if any) synchronous with priority over the enable; else None. Constant enable and
    reset read ("1",) and ("0",)."""
    if ff is None or ff["type"] != "TRELLIS_FF":
        return None
    c = ff["connections"]
    reset = tuple(c.get("LSR", ["0"]))
    if (param(ff, "CLKMUX", "CLK") != "CLK" or param(ff, "GSR") != "DISABLED"
            or param(ff, "LSRMUX", "LSR") != "LSR" or param(ff, "REGSET", "RESET") != "RESET"
            or param(ff, "CEMUX", "CE") not in ("CE", "1")
            or (reset != ("0",) and param(ff, "SRMODE", "LSR_OVER_CE") != "LSR_OVER_CE")):
        return None
    return tuple(c["CLK"]), (tuple(c["CE"]) if param(ff, "CEMUX", "CE") == "CE" else ("1",)), reset


def _is_pin(pin: str, prefix: str) -> bool:
    """``pin`` is ``prefix<digits>`` (one bit of a cell's bus port)."""
    return pin.startswith(prefix) and pin[len(prefix):].isdigit()


def _signal_pins(cell: dict, prefix: str) -> list[str]:
    """The pins ``prefix<digits>`` of ``cell`` wired to a net (not tied to a constant)."""
    return [pin for pin, bits in cell["connections"].items() if _is_pin(pin, prefix) and isinstance(bits[0], int)]


def _registered_outputs(cell: dict, prefixes: tuple[str, ...], loads: dict, cells: dict):
    """The (pin, flip-flop) pairs and the one (clock, enable, reset) of every used output pin
    ``<prefix><digits>`` of ``cell`` (over all ``prefixes``), when each drives exactly one plain
    flip-flop's DI; else None."""
    pairs, controls = [], set()
    for pin in [pin for prefix in prefixes for pin in _signal_pins(cell, prefix)]:
        bits = cell["connections"][pin]
        if not loads[bits[0]]:
            continue
        if len(loads[bits[0]]) != 1 or loads[bits[0]][0][1] != "DI":
            return None
        ctl = _plain_ff(cells.get(loads[bits[0]][0][0]))
        if ctl is None:
            return None
        controls.add(ctl)
        pairs.append((pin, loads[bits[0]][0][0]))
    return (pairs, controls.pop()) if pairs and len(controls) == 1 else None


def _brams(module: dict) -> int:
    cells, loads = module.get("cells", {}), _loads(module)
    moved = 0
    for ram in [c for c in cells.values() if c["type"] == "DP16KD"]:
        # true dual port: each port's output register on its own; pseudo dual port (36 bits):
        # the one word on DOA and DOB, read on port B's clock
        groups = ["AB"] if _int_param(ram, "DATA_WIDTH_A", 18) == 36 else ["A", "B"]
        moved += sum(_output_register(ram, ports, loads, cells) for ports in groups)
    return moved


def _output_register(ram: dict, ports: str, loads: dict, cells: dict) -> int:
    """Give ``ram``'s read data on ``ports`` (``"A"``, ``"B"``, or ``"AB"`` for the 512 x 36 pseudo
    dual-port mode as Yosys maps it: port A writes, port B reads, the word on DOA and DOB) the
    DP16KD's output register, when every used bit feeds one plain flip-flop on the read clock with
    one enable and no reset: ``REGMODE OUTREG`` on each of ``ports`` (both, in the pseudo dual-port
    mode, as the vendor tools set it), that enable on their ``OCE``; the flip-flops are removed."""
    conn, clock = ram["connections"], ram["connections"].get(f"CLK{ports[-1]}")
    if any(param(ram, f"REGMODE_{p}") != "NOREG" or conn.get(f"RST{p}") != ["0"] or conn.get(f"CLK{p}") != clock
           for p in ports):
        return 0
    found = _registered_outputs(ram, tuple(f"DO{p}" for p in ports), loads, cells)
    if found is None or list(found[1][0]) != clock or found[1][2] != ("0",):
        return 0
    pairs, (_, enable, _) = found
    for p in ports:
        ram["parameters"][f"REGMODE_{p}"] = "OUTREG"
        conn[f"OCE{p}"] = list(enable)
    for pin, ff in pairs:
        conn[pin] = cells.pop(ff)["connections"]["Q"]
    return len(pairs)


def _plain_dsp(dsp: dict) -> bool:
    conn = dsp["connections"]
    return all(conn.get(p, ["0"])[0] in ("0", "1") for p in ("SIGNEDA", "SIGNEDB", "SOURCEA", "SOURCEB"))


def _clock_register(dsp: dict, register: str, control: tuple) -> None:
    """Clock ``dsp``'s ``register`` (OUTPUT, INPUTA, INPUTB) on CLK0 with ``control``'s enable (CE0)
    and reset (RST0; RESETMODE SYNC, as the flip-flops' reset: it overrides the enable); every
    register moved into one DSP shares that control."""
    clock, enable, reset = control
    dsp["connections"].update({"CLK0": list(clock), "CE0": list(enable), "RST0": list(reset)})
    dsp.setdefault("port_directions", {}).update({"CLK0": "input", "CE0": "input", "RST0": "input"})
    dsp["parameters"].update({f"REG_{register}_CLK": "CLK0", f"REG_{register}_CE": "CE0",
                              f"REG_{register}_RST": "RST0", "RESETMODE": "SYNC"})


def _only_registers_read(ff: dict, loads: dict, cells: dict) -> bool:
    """Every reader of ``ff``'s output is a flip-flop's data input (no logic, no port)."""
    readers = loads[ff["connections"]["Q"][0]]
    return bool(readers) and all(pin == "DI" and cells.get(name, {}).get("type") == "TRELLIS_FF"
                                 for name, pin in readers)


def bit_drivers(module: dict) -> dict:
    """bit -> (cell, pin) driving it."""
    return {bit: (name, pin) for name, cell in module.get("cells", {}).items()
            for pin, bits in cell["connections"].items()
            if cell.get("port_directions", {}).get(pin) == "output" for bit in bits if isinstance(bit, int)}


def _registered_inputs(dsp: dict, port: str, loads: dict, drivers: dict, cells: dict):
    """The flip-flops and the one (clock, enable, reset) behind operand ``port`` (A or B) of ``dsp``
    when every non-constant pin ``port<n>`` is the output of a plain flip-flop that drives only
    multiplier operand pins (a sign bit may drive several; an operand shared by several
    multipliers drives theirs) and is itself loaded from another flip-flop (an operand the RTL
    registers twice); else None."""
    ffs, controls = set(), set()
    for pin in _signal_pins(dsp, port):
        bits = dsp["connections"][pin]
        source = drivers.get(bits[0])
        ctl = _plain_ff(cells.get(source[0])) if source and source[1] == "Q" else None
        if ctl is None or not all(cells.get(reader, {}).get("type") == "MULT18X18D"
                                  and (_is_pin(p, "A") or _is_pin(p, "B")) for reader, p in loads[bits[0]]):
            return None
        before = drivers.get(cells[source[0]]["connections"]["DI"][0])
        if before is None or cells.get(before[0], {}).get("type") != "TRELLIS_FF" or before[1] != "Q":
            return None
        ffs.add(source[0])
        controls.add(ctl)
    return (ffs, controls.pop()) if ffs and len(controls) == 1 else None


def _dsps(module: dict) -> int:
    cells, moved, operand_ffs = module.get("cells", {}), 0, set()
    dsps = [c for c in cells.values() if c["type"] == "MULT18X18D" and _plain_dsp(c)
            and all(param(c, f"REG_{r}_CLK", "NONE") == "NONE" for r in ("INPUTA", "INPUTB", "INPUTC",
                                                                             "PIPELINE", "OUTPUT"))]
    loads, drivers = _loads(module), bit_drivers(module)
    for dsp in dsps:
        control = None
        found = _registered_outputs(dsp, ("P",), loads, cells)
        if found is not None and all(_only_registers_read(cells[ff], loads, cells) for _, ff in found[0]):
            control = found[1]
            _clock_register(dsp, "OUTPUT", control)
            for pin, ff in found[0]:
                dsp["connections"][pin] = cells.pop(ff)["connections"]["Q"]
            moved += len(found[0])
        # both operands or neither: nextpnr times a DSP with one input registered and the other
        # not as if neither were ("unsupported mixed input register modes")
        ports = [port for port in "AB" if _signal_pins(dsp, port)]
        got = {port: _registered_inputs(dsp, port, loads, drivers, cells) for port in ports}
        controls = {g[1] for g in got.values() if g is not None} | ({control} if control is not None else set())
        if not ports or None in got.values() or len(controls) != 1:
            continue
        for port in ports:
            _clock_register(dsp, f"INPUT{port}", got[port][1])
            for pin in _signal_pins(dsp, port):
                dsp["connections"][pin] = cells[drivers[dsp["connections"][pin][0]][0]]["connections"]["DI"]
            operand_ffs |= got[port][0]
        # a constant operand (every pin tied) gets its register too, on the same control: it
        # loads the same constant, reset and enabled with the other operand, so the product is
        # unchanged, and nextpnr times both inputs as registered (with one, as neither:
        # EAS's kk * cos2 from its operand's register through the multiply, 8.2 ns)
        for port in "AB":
            if port not in ports:
                _clock_register(dsp, f"INPUT{port}", next(iter(controls)))
    # an operand register leaves the fabric once every multiplier reading it holds its copy
    loads_now = _loads(module)
    for ff in operand_ffs:
        if not loads_now[cells[ff]["connections"]["Q"][0]]:
            cells.pop(ff)
            moved += 1
    return moved


def absorb(netlist: Path) -> dict:
    """Rewrite ``netlist`` (Yosys JSON) in place; returns how many flip-flops went into block
    RAMs (``bram``) and into multipliers (``dsp``)."""
    design = json.loads(netlist.read_text())
    moved = {"bram": 0, "dsp": 0}
    for module in design["modules"].values():
        moved["bram"] += _brams(module)
        moved["dsp"] += _dsps(module)
    netlist.write_text(json.dumps(design))
    return moved
