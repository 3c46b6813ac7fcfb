"""One layer's decode step on each attention engine (docs/system.md, "The model"): from the counts its
bit-accurate model recorded inside SmolLM2 (an activity record of ``ladmac eval lad|mac --hardware
--activity``) to cycles, DRAM bytes, SRAM bits, multiply-accumulates and SFM operations. The dense
tile's counts follow from the context alone. Nothing here re-derives a count the models report:
cycles are the records' ``tile_cycles`` (LAD tile: ``golden.lad_tile.schedule_cycles``) and
``rtl_cycles`` (MAC decode engine: its FSM's schedule, equal to the RTL), dense cycles are
``golden.dense.dense_step_cycles`` (equal to the RTL)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from golden.dense import DenseConfig, dense_step_cycles
from golden.errors import DataError
from golden.lad_tile import LadTileConfig
from golden.llm.activity import read_activity
from golden.mac_decode import MacDecodeConfig, dense_head_cycles
from golden.paths import PROJECT_ROOT
from hdl.lad.common import sram_banks

from .shapes import SHAPES, ModelShape

ENGINES = ("dense", "lad-tile", "mac-decode")
RESULTS = PROJECT_ROOT / "benchmarks" / "results"
STEPS = 256                  # decode steps of a record averaged for one context (its last ones)
# synthesis records giving each tile's logic (generic NAND2 equivalents) and post-route clock
SYNTH_RECORDS = {"dense": "synth-s57-dense.json", "lad-tile": "synth-s54-tile.json",
                 "lad-tile-group": "synth-lad-tile-group3-generic.json",
                 "mac-decode": "synth-mac-decode-seed1.json", "vpu": "synth-s50-vpu-sfm-sram.json"}
# kept across steps: these banks, each head's modes (apid.modes<h>) and AC's caches (ac.*)
LAD_PERSISTENT = ("eas.centers", "eas.center_recips", "apid.centers")


@dataclass
class LayerStep:
    """One layer's decode step on one engine, summed over the layer's query heads."""
    cycles: float               # engine cycles, all heads one after another
    kv_bytes: float             # KV-cache bytes read from DRAM
    macs: float                 # multiply-accumulates (16-bit operands, wide accumulators)
    sfm_ops: float              # exponentials / reciprocals
    scratch_bits: float         # on-chip accesses to the tile's per-step buffers (scores)
    state_bits: float           # accesses to the per-head state kept across steps
    stream_bytes: float         # DRAM bytes to bring each head's state in and out when streamed


@dataclass
class Engine:
    """An attention engine at one context: its config, per-head state and scratch capacity (bits),
    and its layer steps (one per layer of the shape)."""
    name: str
    config: object
    context: int
    layers: list
    state_bits_per_head: float
    scratch_bits: float
    logic_ge: float
    clock_mhz: float
    perplexity_delta_pct: float | None
    source: str
    notes: list = field(default_factory=list)
    heads_per_tile: int = 1     # query heads one tile serves (the LAD tile per KV group: its group)

    @property
    def state_bits_per_tile(self) -> float:
        """The state one tile holds: its heads' (one center table for a KV group's)."""
        return self.state_bits_per_head * self.heads_per_tile


# -- activity records ----------------------------------------------------------------------------
# the LAD tile's one-head records (LAD tile v2's format: one query head per tile, keys as centers,
# cutoff -8): for shapes whose KV groups the default group tile cannot serve, and for the LAD paper's
# Table III and the cycle check against the one-head RTL (benchmarks/system_cycles.py)
ONE_HEAD = " --set group=1 --set center_bits=0 --set cutoff=-8"


def record_path(engine: str, context: int, one_head: bool = False) -> Path:
    return RESULTS / f"activity-{engine}{'-one-head' if one_head else ''}-{context}.json"


def record_hint(engine: str, context: int, one_head: bool = False) -> str:
    method = "lad" if engine == "lad-tile" else "mac"
    return (f"ladmac eval {method} --hardware --context {context - STEPS - 1} --tokens {STEPS} --prompts 0 "
            f"--variants {engine}{ONE_HEAD if one_head else ''} --activity FILE")


def load_record(engine: str, context: int, path: Path | None = None, one_head: bool = False) -> dict:
    """The activity record of ``engine`` ending at ``context`` (the repository's at the engine's
    defaults, its one-head LAD record with ``one_head``, or ``path``)."""
    path = path or record_path(engine, context, one_head)
    if not path.is_file():
        raise DataError(f"no {engine} activity record at context {context} ({path.name}); record one with "
                        f"`{record_hint(engine, context, one_head)}` and pass it with --activity")
    record = read_activity(path)
    if record.get("engine") != engine:
        raise DataError(f"{path} records {record.get('engine')}, not {engine}")
    last = record["windows"][-1]["last_context"]
    if not context - 1 <= last <= context:
        raise DataError(f"{path} ends at context {last}, not {context}")
    return record


def layer_means(record: dict, steps: int = STEPS) -> tuple[list[dict], int]:
    """Per layer, each count's mean per decode step over the record's last ``steps`` steps (whole
    windows), and the number of steps averaged."""
    last = record["windows"][-1]["last_context"]
    windows = [w for w in record["windows"] if w["first_context"] > last - steps]
    n = sum(w["steps"] for w in windows)
    layers = []
    for i in range(len(windows[0]["layers"])):
        keys = windows[0]["layers"][i]
        layers.append({k: sum(w["layers"][i][k] for w in windows) / n for k in keys})
    return layers, n


def synth_record(key: str, block: str | None = None) -> dict:
    data = json.loads((RESULTS / SYNTH_RECORDS[key]).read_text())
    for r in data if isinstance(data, list) else [data]:
        if block is None or r["block"] == block:
            return r
    raise DataError(f"{SYNTH_RECORDS[key]} has no {block} record")


def logic_ge(record: dict) -> float:
    """Gate equivalents of a block's logic and flip-flops (its memories are priced as SRAM)."""
    ge = record["generic"]["ge"]
    return ge["logic"] + ge["ff"]


# -- transfer to another shape -------------------------------------------------------------------
def _transfer(layers: list[dict], shape: ModelShape, d_source: int, per_dim: tuple, cycles: str,
              dense_head_cycles: float, heads_per_unit: int = 1) -> list[dict]:
    """SmolLM2's per-layer counts on ``shape``: each target layer takes the source layer at the same
    depth, per-head means times the shape's query heads; the counts in ``per_dim`` (bytes, beats)
    scale with the head dimension; ``cycles`` keeps its recorded ratio to the dense tile's cycles,
    times the dense tile's cycles of a unit (a head, or a group of ``heads_per_unit`` heads on the
    group-aware dense tile) at the shape's head dimension."""
    out = []
    for i in range(shape.layers):
        src = layers[min(len(layers) - 1, i * len(layers) // shape.layers)]
        h = src["heads"]
        t = {k: v / h * shape.q_heads for k, v in src.items()}
        for k in per_dim:
            t[k] *= shape.head_dim / d_source
        units = shape.q_heads // heads_per_unit
        t[cycles] = src[cycles] / src["dense_cycles"] * dense_head_cycles * units
        t["dense_cycles"] = dense_head_cycles * units
        out.append(t)
    return out


def transfer_note(shape: ModelShape, context: int) -> str:
    return (f"activity transferred: SmolLM2-135M's per-head counts at context {context} applied to {shape.name} "
            f"(d {shape.head_dim}, {shape.q_heads} heads, {shape.layers} layers); cycles keep their ratio to dense")


# -- the three engines ---------------------------------------------------------------------------
def dense_engine(shape: ModelShape, context: int, clock_mhz: float | None = None) -> Engine:
    """The dense tile (hdl/dense.py): every key and value of the head, one beat per cycle."""
    cfg = DenseConfig(head_dim=shape.head_dim, max_positions=max(4096, context))
    n, d, H = context, shape.head_dim, shape.q_heads
    step = LayerStep(cycles=H * dense_step_cycles(cfg, n),
                     kv_bytes=shape.kv_heads * 2 * n * d * cfg.kv_width / 8,   # GQA: a group's heads share a read
                     macs=H * 2 * n * d, sfm_ops=H * (n + 1),
                     scratch_bits=H * 2 * n * cfg.score_width, state_bits=0, stream_bytes=0)
    rec = synth_record("dense")
    return Engine("dense", cfg, context, [step] * shape.layers, 0, cfg.max_positions * cfg.score_width,
                  logic_ge(rec), clock_mhz or rec["ecp5"]["fmax_mhz"], 0.0, "analytic (every key and value)")


def lad_engine(shape: ModelShape, context: int, record: dict, clock_mhz: float | None = None,
               vpus: int | None = None) -> Engine:
    """The LAD tile (hdl/lad/tile.py) from its activity record's per-layer counts: a tile per query
    head, or per KV group of ``group`` query heads (one center table and each position's center for
    the group, EAS reading each center once for it; per head its modes, AC's caches, MD's scores)."""
    cfg = LadTileConfig(**record["config"])
    g = cfg.group
    if shape.kv_group % g:
        raise DataError(f"this LAD record's tile serves a KV group of {g} query heads; {shape.name}'s KV groups "
                        f"have {shape.kv_group} (price it with a one-head record, group 1)")
    layers, steps = layer_means(record)
    notes = []
    if shape.head_dim != cfg.head_dim or shape is not SHAPES["smollm2"]:
        notes.append(transfer_note(shape, context))
        d0 = cfg.head_dim
        eas_beats = max(cfg.eas_beats, shape.head_dim // 64)       # at most 64 EAS lanes
        cfg = LadTileConfig(**{**record["config"], "head_dim": shape.head_dim, "eas_beats": eas_beats})
        layers = _transfer(layers, shape, d0, ("kv_beats",), "tile_cycles", dense_step_cycles(cfg, context), g)
    banks = sram_banks(cfg)
    bits = {k: b.depth * b.width for k, b in banks.items()}
    ac_bits = sum(v for k, v in bits.items() if k.startswith("ac.")) / g          # one head's caches
    modes = [k for k in bits if k.startswith("apid.modes")]
    persistent = sum(bits[k] for k in (*LAD_PERSISTENT, *modes)) + ac_bits * g    # the tile's (its group's)
    scratch = sum(bits.values()) - persistent
    d, kvw = cfg.head_dim, cfg.kv_width
    center_bits = banks["eas.centers"].width * cfg.eas_beats + banks["eas.center_recips"].width
    shared_meta = banks["apid.centers"].width           # a position's center and rho, one for the group
    mode_bits = banks[modes[0]].width                   # a position's mode and counters, per head
    xw = banks["apid.approx_scores"].width // g         # one head's score
    out = []
    for c in layers:
        n = c["positions"]                      # the tile's positions (one count for the layer)
        exact = c.get("exact_steps", 0)         # heads past max_positions: an exact pass, state untouched
        lad = c["heads"] - exact                # heads that made a LAD step (a layer's heads go together)
        groups = lad / g                        # their tiles
        centers = c["centers"] * lad / c["heads"]          # summed over heads: EAS scores each for each q
        # EAS reads every center and its recip once for the group; APID reads each position's metadata
        # (the group's center and rho, each head's mode) in pass A and reads and writes it in pass B; AC
        # reads each head's caches once (q.A) and updates a row per mode change; the new key becomes
        # a center and a metadata entry
        state = (centers / g * center_bits + n * 3 * (groups * shared_meta + lad * mode_bits) + lad * ac_bits
                 + c["mode_changes"] * 2 * ac_bits / d + groups * (center_bits + shared_meta) + lad * mode_bits)
        # streamed: each tile's centers, metadata and caches in, metadata and caches out, the new center out
        stream = (centers / g * center_bits + n * 2 * (groups * shared_meta + lad * mode_bits) + lad * 2 * ac_bits
                  + groups * center_bits) / 8
        out.append(LayerStep(
            cycles=c["tile_cycles"], kv_bytes=c["kv_beats"] * cfg.lanes * kvw / 8,
            macs=(centers + c["candidates"] + c["active"]) * d + (2 * lad + c["mode_changes"]) * d * d
            + exact * 2 * n * d,
            sfm_ops=c["active"] + lad + exact * n,
            scratch_bits=2 * (centers + lad * n + exact * n) * xw, state_bits=state, stream_bytes=stream))
    if any(c.get("exact_steps", 0) for c in layers):
        notes.append(f"past max_positions ({cfg.max_positions}) the tile makes an exact pass (dense arithmetic)")
    routed = synth_record("lad-tile")            # the routed one-head tile (the ecp5-85f preset)
    logic = routed if g == 1 else synth_record("lad-tile-group")
    ge = logic_ge(logic)
    want = vpus or cfg.vpus
    ge += (want - logic["config"]["vpus"]) * g * logic_ge(synth_record("vpu", "vpu"))   # VPUs per head
    if g > 1 and not clock_mhz:
        notes.append(f"the LAD tile per KV group has no routed clock yet: priced at the one-head tile's "
                     f"{routed['ecp5']['fmax_mhz']:.1f} MHz (docs/lad-tile.md, synthesis)")
    return Engine("lad-tile", cfg, context, out, persistent / g, scratch, ge,
                  clock_mhz or routed["ecp5"]["fmax_mhz"], record.get("perplexity_delta_pct"),
                  f"{record_source(record)}, {steps} steps", notes, heads_per_tile=g)


def mac_engine(shape: ModelShape, context: int, record: dict, clock_mhz: float | None = None) -> Engine:
    """The MAC decode engine (hdl/mac/decode.py) from its activity record's per-layer counts."""
    cfg = MacDecodeConfig(**record["config"])
    layers, steps = layer_means(record)
    notes = []
    if "rtl_cycles" not in layers[0]:
        raise DataError(f"the {context} mac-decode record predates the engine's RTL cycles (rtl_cycles); "
                        f"record it again with `{record_hint('mac-decode', context)}`")
    if shape.head_dim != cfg.head_dim or shape is not SHAPES["smollm2"]:
        notes.append(transfer_note(shape, context))
        d0 = cfg.head_dim
        cfg = MacDecodeConfig(**{**record["config"], "head_dim": shape.head_dim})
        layers = _transfer(layers, shape, d0, ("kv_bytes", "entry_bytes"), "rtl_cycles",
                           dense_head_cycles(cfg, context))
    d, M = cfg.head_dim, cfg.window
    filled = min(context - 1, M)
    out = []
    for c in layers:
        engaged = c["hits"] + c["misses"]
        out.append(LayerStep(
            cycles=c["rtl_cycles"], kv_bytes=c["kv_bytes"],
            macs=2 * c["head_kv_read"] * d + engaged * filled * d + 3 * c["heads"] * d,
            sfm_ops=c["head_kv_read"] + 3 * c["heads"],
            scratch_bits=2 * c["head_kv_read"] * cfg.score_width,
            state_bits=8 * c["entry_bytes"], stream_bytes=c["entry_bytes"]))
    rec = synth_record("mac-decode")
    per_head = M * (d * cfg.q_width + cfg.entry_bits)
    return Engine("mac-decode", cfg, context, out, per_head, cfg.max_positions * cfg.score_width,
                  logic_ge(rec), clock_mhz or rec["ecp5"]["fmax_mhz"],
                  record.get("perplexity_delta_pct"), f"{record_source(record)}, {steps} steps", notes)


def record_source(record: dict) -> str:
    return f"activity record ({record.get('engine')}, {record.get('model')}, context {record['windows'][-1]['last_context']})"
