"""The technology the system model prices activity with (docs/system.md, "Constants and their sources"): energy per
operation, SRAM access energy, area and leakage, DRAM bandwidth and energy per bit, the logic
area of a NAND2 gate equivalent, and node scaling, all read from ``constants.toml`` (one data file,
every value with its published source)."""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from golden.errors import DataError

CONSTANTS = Path(__file__).resolve().parent / "constants.toml"


@dataclass(frozen=True)
class Dram:
    key: str
    name: str
    bandwidth_gb_s: float
    pj_per_bit: float


class Tech:
    """The constants at a node (``node_nm``: one of the scaling table's nodes; default the table's own)."""

    def __init__(self, node_nm: int | None = None, path: Path = CONSTANTS):
        try:
            self.raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise DataError(f"cannot read the constants {path} ({err})") from None
        self.base_node = int(self.raw["meta"]["node_nm"])
        self.node_nm = self.base_node if node_nm is None else int(node_nm)
        scaling = self.raw["scaling"]
        if str(self.node_nm) not in scaling["energy"]:
            raise DataError(f"no scaling to {self.node_nm} nm (known: {', '.join(sorted(scaling['energy'], key=int))} nm)")
        base = str(self.base_node)
        self.energy_factor = scaling["energy"][str(self.node_nm)] / scaling["energy"][base]
        self.area_factor = scaling["area"][str(self.node_nm)] / scaling["area"][base]

    # -- arithmetic -----------------------------------------------------------------------------
    def op_pj(self, op: str) -> float:
        """Energy of one operation (``int16_mult``, ``int32_add``, ...) in pJ."""
        return self.raw["arith"][op]["energy_pj"] * self.energy_factor

    def mac_pj(self, width: int = 16, acc_width: int = 32) -> float:
        """One multiply-accumulate: a ``width``-bit multiply and an ``acc_width``-bit add."""
        return self.op_pj(f"int{width}_mult") + self.op_pj(f"int{acc_width}_add")

    # -- SRAM -----------------------------------------------------------------------------------
    def sram_pj_per_bit(self, array_bytes: float) -> float:
        """Access energy per bit of an SRAM array of ``array_bytes``: the table's 64-bit access
        energies interpolated log-log in the array size; below the smallest point its energy,
        above the largest the last segment's slope continued (wires grow with the array)."""
        points = sorted(self.raw["sram"]["read_64bit_pj"])
        x = max(array_bytes, points[0][0])
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if x <= x1 or (x1, y1) == tuple(points[-1]):
                t = math.log(x / x0) / math.log(x1 / x0)
                return math.exp(math.log(y0) + t * math.log(y1 / y0)) / 64 * self.energy_factor
        return points[0][1] / 64 * self.energy_factor

    def sram_mm2(self, bits: float) -> float:
        return bits / 8 / 2**20 * self.raw["sram"]["area_mm2_per_mib"] * self.area_factor

    def sram_leak_mw(self, bits: float) -> float:
        return bits / 8 / 2**20 * self.raw["sram"]["leakage_mw_per_mib"] * self.area_factor

    # -- logic ----------------------------------------------------------------------------------
    def logic_mm2(self, gate_equivalents: float) -> float:
        """Area of ``gate_equivalents`` NAND2 gates (a synthesis record's generic count)."""
        return gate_equivalents * self.raw["logic"]["nand2_area_um2"] * 1e-6 * self.area_factor

    def logic_leak_mw(self, mm2: float) -> float:
        return mm2 * self.raw["logic"]["leakage_mw_per_mm2"]

    # -- DRAM -----------------------------------------------------------------------------------
    def dram(self, key: str) -> Dram:
        table = self.raw["dram"]
        if key not in table:
            raise DataError(f"unknown DRAM '{key}' (known: {', '.join(table)})")
        d = table[key]
        return Dram(key, d["name"], float(d["bandwidth_gb_s"]), float(d["energy_pj_per_bit"]))

    @property
    def drams(self) -> list[str]:
        return list(self.raw["dram"])
