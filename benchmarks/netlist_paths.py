"""Register-to-register paths of a synthesised ECP5 netlist, estimated without placing it: where
the design is deep, in seconds instead of nextpnr's half hour of placement (used in
docs/lad-tile.md, "A group of 3 on the LFE5U-85F").

    .venv/bin/python -m benchmarks.netlist_paths build/synth/<block>-<key>/ecp5 [--threshold NS]
        [--top N] [--module top.harness.core] [--routed REPORT] [--out paths.json]

The netlist is the flow's ``top.json`` (``ladmac synth`` writes it before placement). Each path's
delay is a sum of fixed per-cell costs: a routed hop 0.8 ns, a LUT 0.25, a carry cell 0.45 (0.06
along the chain), a PFUMX / L6MUX21 0.15 (no routing from its LUTs), a LUT-RAM read 0.6, a DSP
without an output register 4.0; a flip-flop, a block RAM and a registered DSP start (0.5 / 2.0 ns)
and end (0.2 ns setup) paths. No placement, so long wires and congestion are not in it: it ranks
paths, it does not predict Fmax. Calibration on the LAD tile: the `ecp5-85f` preset (104.0 MHz
routed, mean of 3 seeds) has its worst path at 8.1 ns here; the group-of-3 variant had 15.4 ns, now
8.2 ns (docs/lad-tile.md, "A group of 3 on the LFE5U-85F"). nextpnr's own estimate after placement
does not predict Fmax either: it gives the one-head preset 65.2 MHz.

Prints a histogram of the endpoints' estimated arrival and, for endpoints past ``--threshold``, one
line per (source module, endpoint module): how many endpoints, the worst estimate, the modules the
worst path crosses and its endpoint.

``--routed build/synth/<block>-<key>/ecp5/report.json`` (a route made with ``ladmac synth BLOCK
--net-timings``) takes each endpoint's delay from the route instead: nextpnr's net timings give
every endpoint cell's worst routed path delay, so one route lists all the paths past 10 ns, not
only the critical one. The path shown for each is still the estimate's worst path into that cell
(nextpnr names the endpoint, not its path).
"""
from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

from golden.cli import AtLeast, Parser
from golden.errors import ConfigError
from synth.absorb import bit_drivers, param

ROUTE, LUT, MUX, CARRY, CARRY_CHAIN, LUTRAM, DSP_COMB = 0.8, 0.25, 0.15, 0.45, 0.06, 0.6, 4.0
FF_CLK_TO_Q, HARD_CLK_TO_Q, SETUP = 0.5, 2.0, 0.2


def _registered(cell: dict, register: str) -> bool:
    """Whether the DSP's ``register`` (OUTPUT, INPUTA, INPUTB) is clocked."""
    return param(cell, f"REG_{register}_CLK", "NONE") != "NONE"


class Netlist:
    """One module of a yosys JSON netlist with ECP5 cells: drivers, timing start and end points."""

    def __init__(self, module: dict):
        self.cells = module["cells"]
        self.driver: dict[int, tuple[str, str]] = bit_drivers(module)
        self.arrival: dict[int, tuple[float, int | None]] = {}
        self.inputs: dict[str, list[tuple[str, int]]] = {}

    def starts_path(self, cell: dict) -> float | None:
        """Clock-to-output time if the cell's outputs are registered, else None."""
        t = cell["type"]
        if t == "TRELLIS_FF":
            return FF_CLK_TO_Q
        if t == "DP16KD" or (t == "MULT18X18D" and _registered(cell, "OUTPUT")):
            return HARD_CLK_TO_Q
        return None

    def ends_path(self, cell: dict, port: str) -> bool:
        t = cell["type"]
        if t in ("TRELLIS_FF", "DP16KD"):
            return True
        if t == "MULT18X18D":
            if port.startswith("A"):
                return _registered(cell, "INPUTA")
            if port.startswith("B"):
                return _registered(cell, "INPUTB")
            return True
        return t == "TRELLIS_DPR16X4" and port != "RAD"     # the write side is synchronous

    @staticmethod
    def _delay(cell: dict, port: str, out: str) -> float:
        t = cell["type"]
        if t in ("PFUMX", "L6MUX21"):
            return MUX
        if t == "CCU2C":
            return CARRY_CHAIN if port == "CIN" and out == "COUT" else CARRY
        if t == "TRELLIS_DPR16X4":
            return LUTRAM
        if t == "MULT18X18D":
            return DSP_COMB
        return LUT

    @staticmethod
    def _hop(cell: dict, port: str) -> float:
        t = cell["type"]
        if (t == "CCU2C" and port == "CIN") or (t in ("PFUMX", "L6MUX21") and port in ("ALUT", "BLUT", "D0", "D1")):
            return 0.0      # dedicated wires inside a slice
        return ROUTE

    def _inputs(self, name: str) -> list[tuple[str, int]]:
        """(port, bit) of cell ``name``'s inputs that a path runs through (not its registered ones);
        listed once per cell, for each of its output bits and both visits of the walk."""
        if name not in self.inputs:
            cell = self.cells[name]
            self.inputs[name] = [(port, b) for port, bits in cell["connections"].items()
                                 if cell["port_directions"].get(port) == "input" and not self.ends_path(cell, port)
                                 for b in bits if isinstance(b, int)]
        return self.inputs[name]

    def arrive(self, bit: int) -> float:
        """Estimated arrival of ``bit``: an iterative depth-first walk, each bit finished after all
        its inputs; an input on the walk's own path (a combinational loop) is left out."""
        on_path: set[int] = set()
        stack = [(bit, False)]
        while stack:
            b, expanded = stack.pop()
            if b in self.arrival:
                continue
            driver = self.driver.get(b)
            cell = self.cells[driver[0]] if driver else None
            start = self.starts_path(cell) if cell else 0.0
            if start is not None:            # an input port, or a register's output
                self.arrival[b] = (start, None)
                continue
            if not expanded:
                on_path.add(b)
                stack.append((b, True))
                stack += [(ib, False) for _, ib in self._inputs(driver[0])
                          if ib not in self.arrival and ib not in on_path]
                continue
            on_path.discard(b)
            best = (0.0, None)
            for port, ib in self._inputs(driver[0]):
                if ib in self.arrival:
                    t = self.arrival[ib][0] + self._hop(cell, port) + self._delay(cell, port, driver[1])
                    if t > best[0]:
                        best = (t, ib)
            self.arrival[b] = best
        return self.arrival[bit][0]

    def trace(self, bit: int) -> list[int]:
        path = []
        while bit is not None:
            path.append(bit)
            bit = self.arrival.get(bit, (0.0, None))[1]
        return path[::-1]

    def endpoints(self):
        """[(estimated ns, cell, port, bit)], worst first."""
        ends = []
        for name, c in self.cells.items():
            for port, bits in c["connections"].items():
                if c["port_directions"].get(port) == "input" and self.ends_path(c, port):
                    ends += [(self.arrive(b) + ROUTE + SETUP, name, port, b) for b in bits if isinstance(b, int)]
        return sorted(ends, reverse=True)


def module_of(cell: str) -> str:
    """The submodule a cell belongs to (two levels), or the register it drives at the top level."""
    parts = cell.lstrip("\\").split(".")
    name = ".".join(parts[:2]) if len(parts) > 2 else parts[0]
    return re.sub(r"(_TRELLIS_FF_Q|_LUT4|_PFUMX|_CCU2C|_L6MUX21).*", "", name)


def routed_arrivals(report: Path, prefix: str = "harness.core.") -> dict[str, float]:
    """Endpoint cell (its name in Yosys's netlist) -> the delay of its worst routed path (ns). A
    nextpnr ``--report`` written with ``--detailed-timing-report`` lists, for each net into a timing
    endpoint, the worst path delay to that endpoint (the critical path's is its delay)."""
    nets = json.loads(report.read_text()).get("detailed_net_timings")
    if nets is None:
        raise ConfigError(f"{report} has no net timings (route with `ladmac synth BLOCK --net-timings`)")
    arrivals: dict[str, float] = {}
    for net in nets:
        for end in net["endpoints"]:
            if end["cell"].startswith(prefix):
                cell = end["cell"][len(prefix):]
                arrivals[cell] = max(arrivals.get(cell, 0.0), end["delay"][1])
    return arrivals


def report(net: Netlist, threshold: float, top: int, routed: dict[str, float] | None = None) -> dict:
    """Endpoints past ``threshold`` grouped by (source, endpoint module). With ``routed``
    (:func:`routed_arrivals`) each endpoint cell's delay is its routed one, and the path shown is
    the estimate's worst path into that cell (nextpnr names the endpoint, not its path)."""
    ends = net.endpoints()
    if routed is not None:
        worst_input: dict[str, tuple[str, int]] = {}
        for _, cell, port, bit in ends:
            worst_input.setdefault(cell, (port, bit))
        ends = sorted(((t, cell, *worst_input[cell]) for cell, t in routed.items() if cell in worst_input),
                      reverse=True)
    hist = collections.Counter(int(t) for t, *_ in ends)
    groups: dict[tuple[str, str], dict] = {}
    for t, cell, port, bit in ends:
        if t < threshold:
            break
        path = net.trace(bit)
        src = net.driver.get(path[0])
        key = (module_of(src[0]) if src else "(input)", module_of(cell))
        g = groups.setdefault(key, {"source": key[0], "endpoint_module": key[1], "endpoints": 0})
        g["endpoints"] += 1
        if "worst_ns" not in g:
            crossed = []
            for b in path:
                d = net.driver.get(b)
                if d and (not crossed or crossed[-1] != module_of(d[0])):
                    crossed.append(module_of(d[0]))
            g.update(worst_ns=round(t, 2), levels=len(path), via=crossed, endpoint=f"{cell}.{port}")
    rows = sorted(groups.values(), key=lambda g: -g["worst_ns"])[:top]
    return {"endpoints": len(ends), "worst_ns": round(ends[0][0], 2) if ends else 0.0,
            "histogram_ns": {k: hist[k] for k in sorted(hist)}, "threshold_ns": threshold, "groups": rows}


def main(argv=None) -> int:
    """Bad input (no netlist there, no such module, a bad option): one line on stderr, exit 2."""
    try:
        return _main(argv)
    except ConfigError as err:
        print(f"netlist_paths: error: {err}", file=sys.stderr)
        return 2


def _main(argv) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("netlist", type=Path, help="a synth run's ecp5 folder or its top.json")
    p.add_argument("--threshold", type=float, default=7.0, help="list endpoints estimated at or past this (ns)")
    p.add_argument("--top", type=int, action=AtLeast, minimum=1, default=40, help="lines of the list")
    p.add_argument("--module", default="top.harness.core", help="the netlist module to analyse")
    p.add_argument("--routed", type=Path, metavar="REPORT",
                   help="a route's nextpnr report with net timings (--detailed-timing-report): each "
                        "endpoint's routed delay instead of the estimate")
    p.add_argument("--out", type=Path, help="write the report as JSON here")
    args = p.parse_args(argv)
    path = args.netlist / "top.json" if args.netlist.is_dir() else args.netlist
    if not path.is_file():
        raise ConfigError(f"no netlist at {path} (`ladmac synth BLOCK` writes ecp5/top.json)")
    modules = json.loads(path.read_text())["modules"]
    if args.module not in modules:
        raise ConfigError(f"{path} has no module {args.module!r}")
    if args.routed is not None and not args.routed.is_file():
        raise ConfigError(f"no report at {args.routed}")
    routed = routed_arrivals(args.routed) if args.routed else None
    r = report(Netlist(modules[args.module]), args.threshold, args.top, routed)
    r["netlist"] = str(path)
    if routed is not None:
        r["routed"] = str(args.routed)
    print(f"{path}: {r['endpoints']} endpoint{' cells' if routed is not None else 's'}, worst "
          f"{r['worst_ns']:.1f} ns " + (f"(routed: {args.routed}; paths shown as estimated)" if routed is not None
                                      else "(estimate before placement)"))
    for ns, n in r["histogram_ns"].items():
        print(f"  {ns:3d}-{ns + 1:<3d} ns  {n}")
    print(f"endpoints at or past {args.threshold} ns, by source -> endpoint module:")
    for g in r["groups"]:
        print(f"  {g['endpoints']:6d}  {g['worst_ns']:5.1f} ns  {g['source']} -> {g['endpoint_module']}"
              f"  ({g['levels']} cells: {' > '.join(g['via'])[:160]})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
