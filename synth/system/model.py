"""A whole model's decode step on the accelerator (docs/system.md, "The model"): each layer's
attention on ``tiles`` copies of one engine, then its projections and MLP on a GEMV engine, both at
one clock and one DRAM. Time per layer is each phase's roofline: ``max(cycles / (tiles f), DRAM
bytes / bandwidth)``, phases one after the other. Energy: DRAM bits × pJ/bit, SRAM bits × pJ/bit
of the array they sit in, multiply-accumulates and SFM operations × their energy, and the leakage
of logic and SRAM over the step's time. Per-head state is either resident (every head's in SRAM)
or streamed (a tile holds the state of the heads it serves, one head or a KV group, at a time; it
comes from DRAM and goes back every step)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .engines import Engine
from .shapes import ModelShape
from .tech import Dram, Tech

RESIDENCY = ("resident", "streamed")


@dataclass
class StepResult:
    """One decode step of the whole model: time, energy by part (J), silicon."""
    engine: str
    residency: str
    context: int
    seconds: float
    attention_seconds: float
    energy: dict                 # part -> J per token: dram, sram, arith, static (whole model)
    attention_energy: dict       # the same, attention only
    sram_mib: float
    area_mm2: float
    attention_area_mm2: float
    tiles: int
    clock_mhz: float
    gemv_lanes: int
    dram_bytes: float
    perplexity_delta_pct: float | None

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.seconds

    @property
    def joules(self) -> float:
        return sum(self.energy.values())

    @property
    def attention_joules(self) -> float:
        return sum(self.attention_energy.values())

    def to_dict(self) -> dict:
        return {"engine": self.engine, "residency": self.residency, "context": self.context,
                "tokens_per_s": self.tokens_per_s, "step_s": self.seconds, "attention_s": self.attention_seconds,
                "energy_per_token_j": self.joules, "energy_j": self.energy,
                "attention_energy_per_token_j": self.attention_joules, "attention_energy_j": self.attention_energy,
                "sram_mib": self.sram_mib, "area_mm2": self.area_mm2, "attention_area_mm2": self.attention_area_mm2,
                "tiles": self.tiles, "clock_mhz": self.clock_mhz, "gemv_lanes": self.gemv_lanes,
                "dram_bytes_per_token": self.dram_bytes, "perplexity_delta_pct": self.perplexity_delta_pct}


def gemv_lanes_for(dram: Dram, clock_mhz: float, weight_bits: int) -> int:
    """Multiply-accumulate lanes that keep up with the DRAM's weight stream (the GEMV's floor)."""
    return max(1, math.ceil(dram.bandwidth_gb_s * 1e9 / (clock_mhz * 1e6 * weight_bits / 8)))


def default_tiles(engine: Engine, shape: ModelShape) -> int:
    """One tile per unit of a layer's work: a query head, or a KV group for a tile serving one."""
    return shape.q_heads // engine.heads_per_tile


def decode_step(engine: Engine, shape: ModelShape, tech: Tech, dram: Dram, tiles: int | None, residency: str,
                clock_mhz: float | None = None, gemv_lanes: int | None = None) -> StepResult:
    """The whole model's decode step with ``engine``'s attention (see the module's docstring) on
    ``tiles`` tiles (None: :func:`default_tiles`)."""
    units = default_tiles(engine, shape)
    tiles = tiles or units
    f = (clock_mhz or engine.clock_mhz) * 1e6
    bw = dram.bandwidth_gb_s * 1e9
    lanes = gemv_lanes or gemv_lanes_for(dram, f / 1e6, shape.weight_bits)
    mac = tech.mac_pj(16, 32) * 1e-12
    sfm = (tech.op_pj("int16_mult") + 2 * tech.op_pj("int32_add")) * 1e-12   # a PWL segment: multiply, two adds
    dram_j = dram.pj_per_bit * 1e-12 * 8
    streamed = residency == "streamed"
    state_array = engine.state_bits_per_tile / 8
    scratch_array = max(engine.scratch_bits / 8, 1)

    # attention: time, DRAM, SRAM, arithmetic per layer
    att_s = att_dram = att_sram = att_arith = 0.0
    kv_write = shape.kv_heads * 2 * shape.head_dim * 2                      # the new key and value, 16 bits
    for step in engine.layers:
        dram_bytes = step.kv_bytes + kv_write + (step.stream_bytes if streamed else 0)
        att_s += max(step.cycles / min(tiles, units) / f, dram_bytes / bw)
        att_dram += dram_bytes
        # the state is read and written in SRAM either way (streamed: in the tile's copy, after DRAM)
        att_sram += (step.scratch_bits * tech.sram_pj_per_bit(scratch_array)
                     + step.state_bits * tech.sram_pj_per_bit(state_array)) * 1e-12
        att_arith += step.macs * mac + step.sfm_ops * sfm
    # the rest of the model: weights streamed from DRAM through the GEMV
    weights = shape.step_weights
    gemv_s = sum(max(w * shape.weight_bits / 8 / bw, w / (lanes * f))
                 for w in [shape.layer_weights] * shape.layers + [shape.vocab * shape.hidden])
    seconds = att_s + gemv_s

    # silicon: tiles (logic + scratch, + one head's state when streamed), resident state, the GEMV
    tile_sram_bits = engine.scratch_bits + (engine.state_bits_per_tile if streamed else 0)
    resident_bits = 0 if streamed else engine.state_bits_per_head * shape.layers * shape.q_heads
    sram_bits = tiles * tile_sram_bits + resident_bits
    tile_logic = tech.logic_mm2(engine.logic_ge)
    gemv_mm2 = lanes * (tech.raw["arith"]["int16_mult"]["area_um2"] + tech.raw["arith"]["int32_add"]["area_um2"]) \
        * 1e-6 * tech.area_factor
    att_area = tiles * tile_logic + tech.sram_mm2(sram_bits)
    area = att_area + gemv_mm2
    att_leak = (tech.logic_leak_mw(tiles * tile_logic) + tech.sram_leak_mw(sram_bits)) * 1e-3
    gemv_leak = tech.logic_leak_mw(gemv_mm2) * 1e-3

    attention = {"dram": att_dram * dram_j, "sram": att_sram, "arith": att_arith, "static": att_leak * seconds}
    whole = {"dram": attention["dram"] + weights * shape.weight_bits / 8 * dram_j,
             "sram": attention["sram"],
             "arith": attention["arith"] + weights * mac,
             "static": (att_leak + gemv_leak) * seconds}
    return StepResult(engine.name, residency, engine.context, seconds, att_s, whole, attention,
                      sram_bits / 8 / 2**20, area, att_area, tiles, f / 1e6, lanes,
                      att_dram + weights * shape.weight_bits / 8, engine.perplexity_delta_pct)


def tiles_in_budget(engine: Engine, shape: ModelShape, residency: str, budget_mib: float) -> int:
    """How many tiles fit ``budget_mib`` of SRAM (0: not even the resident state fits)."""
    per_tile = engine.scratch_bits + (engine.state_bits_per_tile if residency == "streamed" else 0)
    resident = 0 if residency == "streamed" else engine.state_bits_per_head * shape.layers * shape.q_heads
    left = budget_mib * 8 * 2**20 - resident
    return max(0, int(left // per_tile)) if per_tile else 10**9
