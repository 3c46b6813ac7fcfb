"""The LAD paper's Table III (HPCA 2025 slides: area and power of one LAD tile) next to this model's
LAD tile with the paper's 7 VPUs and 1.5 / 2.5 / 3.5 MB of SRAM (docs/system.md, "LAD Table III").
The model's tile: logic from the synthesised tile's generic gate count (4 VPUs) plus three more
VPUs' (their own synthesis record), SRAM of the paper's capacity; dynamic power from the recorded
SmolLM2 activity per head step at ``context`` over that step's cycles at the paper's clock."""
from __future__ import annotations

from dataclasses import replace

from .engines import lad_engine, load_record
from .shapes import SHAPES
from .tech import Tech

# Table III: SRAM MB -> (tile area mm^2, tile dynamic mW, tile static mW, SRAM area, SRAM dynamic mW, SRAM static)
PAPER = {1.5: (2.160, 1165.34, 235.06, 1.596, 733.33, 118.25),
         2.5: (2.795, 1273.98, 310.39, 2.231, 841.97, 193.58),
         3.5: (3.751, 1634.83, 393.36, 3.187, 1202.82, 276.55)}
PAPER_VPUS = 7


def table3(context: int = 4096, node_nm: int | None = None, clock_mhz: float | None = None,
           workload: str = "llama2-7b") -> dict:
    """Rows of the comparison for each of the paper's SRAM sizes, plus the setup used."""
    probe = Tech()
    node = node_nm or probe.raw["lad_paper"]["node_nm"]
    clock = clock_mhz or probe.raw["lad_paper"]["clock_mhz"]
    tech = Tech(node)
    shape = SHAPES[workload]
    eng = lad_engine(shape, context, load_record("lad-tile", context, one_head=True), clock_mhz=clock, vpus=PAPER_VPUS)
    eng = replace(eng, config=replace(eng.config, vpus=PAPER_VPUS))
    heads = len(eng.layers) * shape.q_heads
    cyc = sum(s.cycles for s in eng.layers) / heads                       # one head step
    macs = sum(s.macs for s in eng.layers) / heads
    sfm = sum(s.sfm_ops for s in eng.layers) / heads
    # the paper's tile keeps its head's keys and values in its SRAM: the KV reads are SRAM reads there
    bits = sum(s.state_bits + s.scratch_bits + 8 * s.kv_bytes for s in eng.layers) / heads
    t = cyc / (clock * 1e6)
    logic_mm2 = tech.logic_mm2(eng.logic_ge)
    vpu_mw = macs * tech.mac_pj() * 1e-12 / t * 1e3
    # an upper bound on the logic's dynamic power: every gate of the tile's netlist switching, every
    # cycle, at the energy per gate of a 16-bit multiplier doing one multiply (Horowitz's energy over
    # his area in NAND2 equivalents); operators alone (vpu_mw, sfm_mw) are the lower bound
    mult = tech.raw["arith"]["int16_mult"]
    pj_per_ge = mult["energy_pj"] / (mult["area_um2"] / tech.raw["logic"]["nand2_area_um2"]) * tech.energy_factor
    netlist_mw = eng.logic_ge * pj_per_ge * clock * 1e6 * 1e-12 * 1e3
    sfm_mw = sfm * (tech.op_pj("int16_mult") + 2 * tech.op_pj("int32_add")) * 1e-12 / t * 1e3
    rows = []
    for mb, (p_area, p_dyn, p_static, p_sram_area, p_sram_dyn, p_sram_static) in PAPER.items():
        sram_bits = mb * 8 * 2**20
        sram_mm2 = tech.sram_mm2(sram_bits)
        sram_mw = bits * tech.sram_pj_per_bit(mb * 2**20) * 1e-12 / t * 1e3
        dyn = vpu_mw + sfm_mw + sram_mw
        static = tech.logic_leak_mw(logic_mm2) + tech.sram_leak_mw(sram_bits)
        row = {"sram_mb": mb,
               "model": {"area_mm2": logic_mm2 + sram_mm2, "sram_area_mm2": sram_mm2, "logic_area_mm2": logic_mm2,
                         "dynamic_mw": dyn, "sram_dynamic_mw": sram_mw, "arith_dynamic_mw": vpu_mw + sfm_mw,
                         "dynamic_netlist_mw": sram_mw + netlist_mw,
                         "sram_power_share_netlist": sram_mw / (sram_mw + netlist_mw),
                         "static_mw": static,
                         "sram_area_share": sram_mm2 / (sram_mm2 + logic_mm2), "sram_power_share": sram_mw / dyn},
               "paper": {"area_mm2": p_area, "sram_area_mm2": p_sram_area, "dynamic_mw": p_dyn,
                         "sram_dynamic_mw": p_sram_dyn, "static_mw": p_static,
                         "sram_area_share": p_sram_area / p_area, "sram_power_share": p_sram_dyn / p_dyn}}
        m, p = row["model"], row["paper"]
        row["checks"] = {"sram_area_share_points": 100 * (m["sram_area_share"] - p["sram_area_share"]),
                         "sram_power_share_points": 100 * (m["sram_power_share"] - p["sram_power_share"]),
                         "dynamic_ratio": m["dynamic_mw"] / p["dynamic_mw"]}
        row["pass"] = (abs(row["checks"]["sram_area_share_points"]) <= 15
                       and abs(row["checks"]["sram_power_share_points"]) <= 15
                       and 0.5 <= row["checks"]["dynamic_ratio"] <= 2)
        rows.append(row)
    return {"context": context, "workload": shape.name, "notes": eng.notes, "node_nm": node, "clock_mhz": clock, "vpus": PAPER_VPUS,
            "head_step_cycles": cyc, "head_step_macs": macs, "head_step_sram_bits": bits,
            "logic_ge": eng.logic_ge, "rows": rows}


def print_table3(res: dict) -> None:
    for note in res["notes"]:
        print(f"note: {note}")
    print(f"LAD Table III: one tile, {res['vpus']} VPUs, {res['node_nm']} nm, {res['clock_mhz']:.0f} MHz; "
          f"activity: a {res['workload']} head step at context {res['context']} ({res['head_step_cycles']:.0f} cycles, "
          f"{res['head_step_macs']:.0f} MACs, {res['head_step_sram_bits'] / 8 / 1024:.0f} KiB of SRAM accesses)")
    print("model / paper; dynamic power and SRAM's share of it: operators only (the system model's) and, in\n"
          "brackets, with every logic gate switching each cycle (upper bound)")
    print(f"{'SRAM':>6} {'area mm2':>17} {'SRAM area share':>16} {'dynamic mW':>24} {'SRAM power share':>24} "
          f"{'static mW':>11}  within bounds")
    for r in res["rows"]:
        m, p = r["model"], r["paper"]
        print(f"{r['sram_mb']:>4} MB {m['area_mm2']:>7.3f} / {p['area_mm2']:<7.3f} "
              f"{100 * m['sram_area_share']:>5.1f} / {100 * p['sram_area_share']:<5.1f}%  "
              f"{m['dynamic_mw']:>5.0f} ({m['dynamic_netlist_mw']:>5.0f}) / {p['dynamic_mw']:<7.0f} "
              f"{100 * m['sram_power_share']:>5.1f} ({100 * m['sram_power_share_netlist']:>4.1f}) / "
              f"{100 * p['sram_power_share']:<5.1f}%  {m['static_mw']:>3.0f} / {p['static_mw']:<4.0f} "
              f"{'yes' if r['pass'] else 'NO'}")
