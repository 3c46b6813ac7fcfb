"""The LAD tile's modules one at a time under Verilator (EAS, APID, MD, AC), each bit-exact
against its part of golden.lad_tile.LadTileModel (the model's per-module trace and its
module-level methods), with random stimulus (seed in the parameters), corner cases and
random gaps / back-pressure / latency on every stream port; then the tile
(test_lad_tile.py). Small preset: d = 32, 4 beats, 2 AC VPUs, 64 positions, 8 centers."""
from dataclasses import replace
from pathlib import Path

import pytest

from golden.lad_tile import PRESETS
from testbenches.runner import simulate

SEED = 2026
SMALL = PRESETS["small"]
TRACE = Path(__file__).parent / "data" / "smollm2_lad_trace.pt"   # real SmolLM2 q/k/v (layer 12 et al.)
GROUP_TRACE = Path(__file__).parent / "data" / "smollm2_group_trace.pt"   # one KV group: layer 9, query heads 3-5


# rho with 22 fraction bits: the tiny center's rho shift mf + e - rho_frac is negative (a left shift)
WIDE_RHO = replace(SMALL, rho_width=24, rho_frac=22)


@pytest.mark.parametrize("kind, steps, seed, eas_beats, center_bits, group",
                         [("drift", 40, SEED, 1, 0, 1), ("trace", 24, SEED + 1, 2, 0, 1), ("drift", 40, SEED + 6, 4, 0, 1),
                          ("trace", 24, SEED + 12, 2, 8, 1), ("drift", 40, SEED + 13, 1, 6, 3),
                          ("trace", 24, SEED + 14, 2, 8, 3)])
def test_lad_eas_rtl_equals_golden(kind, steps, seed, eas_beats, center_bits, group):
    """Drift with the EAS corner keys (first step, zero key, rho saturating both ways, rho < 0,
    full center table, zero key joining, join verdicts that t's rounding decides, a join won by t's
    lowest bit) at rho_frac 22 (a tiny center's rho shifts left, one 4x its norm right by 1), one
    center per cycle and one per 4 cycles (``eas_beats``: each center and q, k_n read in 4 beats),
    and a real SmolLM2 head (every key a new center until the table is full) at the small preset,
    one center per 2 cycles (q and k_n copied as two 16-element words, each written by two load
    beats: the only run whose copies have more than one word of more than one beat). Compact centers
    (``center_bits`` 6 and 8 of the 16-bit keys: mantissas and an exponent per center) on both kinds:
    the dots of mantissas shifted by the exponent, the key's exponent from its extremes as it loads,
    the rounded mantissas written. A KV group's three query heads (``group`` 3: random queries against
    the drift keys with the corners, and a real SmolLM2 group, layer 9's heads 3-5, with 8-bit
    centers): one center table, each center read once and dotted with every query, each head's s_n
    and s^ from the score word of the group."""
    params = {"steps": steps, "kind": kind, "eas_corners": kind == "drift", "extra_lookups": 4}
    if kind == "trace":
        params.update({"trace": str(TRACE), "head": 1} if group == 1 else {"trace": str(GROUP_TRACE)})
    cfg = replace(WIDE_RHO if kind == "drift" else SMALL, eas_beats=eas_beats, center_bits=center_bits, group=group)
    name = (f"{kind}-c{center_bits}" if center_bits else kind) + (f"-g{group}" if group > 1 else "")
    r = simulate("lad-eas", cfg, "testbenches.tb.tb_lad_eas", seed=seed, name=name, params=params)
    assert r["mismatches"] == 0 and r["steps"] == steps, r["mismatch_list"]
    assert r["centers"] == SMALL.max_centers and r["full_joins"] > 0 and r["recips"] == r["new_centers"]
    assert r["nonzero_approx"] > r["lookups"] // 2 and r["extra_lookups"] > 0
    if group > 1:
        assert r["heads_differ"] > r["steps"] // 2
    if cfg.compact_centers:
        assert r["compact_centers"] > 0, r          # some centers are not their key
        return
    assert r["compact_centers"] == 0
    if kind == "drift":
        assert r["zero_keys"] == 2 and r["rho_saturated"] >= 2 and r["rho_negative"] > 0 and r["joins"] > 10
        assert r["rho_left_shift"] > 0 and r["rho_shift_one"] > 0
        assert r["joins_by_rounding_up"] > 0 and r["new_centers_by_rounding_down"] > 0
        assert r["joins_by_lowest_bit"] > 0
        assert r["approx_saturated"] > 0


def test_lad_eas_rates_with_nothing_stalling():
    """With no gaps, no back-pressure and a one-cycle RECIP: a step's lookups (APID's plus the extra
    ones) leave as ``approx`` one a cycle (the rho FIFO holds the score SRAM's reads in flight; one
    entry short it passes every value but loses a cycle in every read_latency + 1), and a step's
    cycles from start to key_out grow by ``eas_beats`` per center scanned (steps making a new center
    from 1 to 7 centers; full-table joins all alike)."""
    r = simulate("lad-eas", SMALL, "testbenches.tb.tb_lad_eas", seed=SEED + 8, name="rate",
                 params={"steps": 12, "kind": "trace", "trace": str(TRACE), "head": 1, "extra_lookups": 4,
                         "gap": 0.0, "stall": 0.0, "latency": [1, 1]})
    assert r["mismatches"] == 0 and r["steps"] == 12, r["mismatch_list"]
    assert r["lookups"] > 40 and r["lookup_idle_cycles"] == 0, r
    new = [cycles - centers * SMALL.eas_beats for cycles, (centers, made) in zip(r["step_cycles"], r["step_centers"])
           if made and centers > 0]
    joins = [cycles for cycles, (centers, made) in zip(r["step_cycles"], r["step_centers"]) if not made]
    assert len(new) >= 6 and len(set(new)) == 1 and len(joins) >= 3 and len(set(joins)) == 1, r["step_cycles"]


@pytest.mark.parametrize("kind, steps, seed, group", [("drift", 64, SEED, 1), ("all_active", 30, SEED + 2, 1),
                                                      ("zero_interval", 40, SEED + 3, 1), ("drift", 64, SEED + 5, 3),
                                                      ("trace", 40, SEED + 6, 3)])
def test_lad_apid_rtl_equals_golden(kind, steps, seed, group):
    """Drift over all max_positions = 64 positions (metadata SRAM full, scan length 63), every
    position a candidate (all_active), no candidates at all (zero_interval); mode counters
    saturate and halve (quiet bumps) and later show up in candidates' metadata. A KV group's
    three query heads (``group`` 3: random queries against the drift keys, and a real SmolLM2
    group, layer 9's heads 3-5): one center and rho per position, each head's modes, m,
    candidates and verdicts its own, the heads taking each position in lockstep."""
    params = {"steps": steps, "kind": kind, **({"trace": str(GROUP_TRACE)} if kind == "trace" else {})}
    r = simulate("lad-apid", replace(SMALL, group=group), "testbenches.tb.tb_lad_apid", seed=seed,
                 name=kind + (f"-g{group}" if group > 1 else ""), params=params)
    assert r["mismatches"] == 0 and r["steps"] == steps, r["mismatch_list"]
    if group > 1:
        assert r["heads_differ"] > r["steps"] // 2 and r["candidates"] > 0 and r["quiet"] > 0
        assert r["nonzero_smax"] > 0 and r["lookups"] == r["positions"]
        return
    assert r["nonzero_smax"] > 0 and r["lookups"] == r["positions"]
    if kind == "drift":
        assert r["last_position"] == SMALL.max_positions - 1
        assert r["candidates"] > 0 and r["quiet"] > 0 and r["halved_seen"] > 0 and r["changed_mode_seen"] > 0
    elif kind == "all_active":
        assert r["candidates"] > 0.4 * r["positions"] and r["all_candidate_steps"] > 0
    else:
        assert r["no_candidate_steps"] > 0 and r["quiet_halvings"] > 0


@pytest.mark.parametrize("kind, steps, seed, inflight", [("drift", 40, SEED, SMALL.md_inflight),
                                                         ("all_active", 24, SEED + 4, SMALL.md_inflight),
                                                         ("drift", 12, SEED + 7, 1)])
def test_lad_md_rtl_equals_golden(kind, steps, seed, inflight):
    """The tile's candidates of a drift / all-active sequence plus random candidates with
    saturated counters (halving), corner steps at the extremes of m (x saturates) and steps whose
    m puts an active's weight one step below rounding up; also with
    one candidate in flight (``md_inflight = 1``, the smallest valid). ``busy`` is checked to stay
    high from each candidate's acceptance to its verdict and its last correction; in the
    all-active run AC stalls for up to ``6 beats`` cycles at a time (the corrections' FIFO fills)."""
    cfg = replace(SMALL, md_inflight=inflight)
    r = simulate("lad-md", cfg, "testbenches.tb.tb_lad_md", seed=seed, name=f"{kind}-{inflight}",
                 params={"steps": steps, "kind": kind, "extra_candidates": 2, "latency": [1, 10],
                         "corr_hold": 6 * cfg.beats if kind == "all_active" else 1})
    assert r["mismatches"] == 0, r["mismatch_list"]
    assert r["trace_candidates"] > 0 and r["active"] > 0 and r["false_alarms"] > 0 and r["mode_changes"] > 0
    assert r["halvings"] > 0 and r["x_saturated"] > 0 and r["nonzero_w"] > 0 and r["rounding_edges"] >= 4
    if inflight > 1:   # pipelined: key reads of the next candidates in flight
        assert r["overlapped"] > 0.3 * r["candidates"]
    else:              # one slot: the next key read waits for the verdict
        assert r["overlapped"] == 0
    assert r["busy_cycles_checked"] > r["candidates"]
    if steps >= 24:    # the short one-slot run reaches only some intervals
        assert r["intervals_seen"] == list(range(SMALL.n_intervals))


@pytest.mark.parametrize("kind, steps, seed, ac_lanes, intervals", [("drift", 40, SEED, 0, 8), ("all_active", 20, SEED + 5, 0, 8),
                                                                    ("drift", 24, SEED + 6, 2, 1)])
def test_lad_ac_rtl_equals_golden(kind, steps, seed, ac_lanes, intervals):
    """The tile's command sequence of a drift / all-active sequence: first step (empty caches,
    Z = 0 into RECIP), corrections, mode-change cache updates, absorptions, extreme values (v =
    127, k = -100 in drift); probes read o of the cache terms alone; in drift, RECIP's corners (Z
    moved to a power of two: mantissa 1.0, below zero: the largest mantissa, and saturated) with the cache
    terms' N. ``ac_lanes = 2``: the scalar-times-vector arithmetic two lanes a cycle (4 cycles a
    beat), as the FPGA preset does, with out stalled 95 % of the cycles (a FINISH's beats still leave
    when the commands behind it would start the next). Cycles: a TERMS after a QA does not run the
    pass again. ``decoy``: a QA and TERMS of another q right before a step's TERMS (a QA serves one
    TERMS: the step's runs its own pass); ``busy`` high while a FINISH's beats remain.
    ``intervals = 1`` (one PWL interval over [-12, 0]): EXP's coefficients and MD's alpha, beta
    are 6 bits, so each lane's ``g = round_shift(alpha v, 8)`` is narrower than its word of the g
    file (the fuzzer's failing lad-tile config: each g must be sign-extended to its word); no
    RECIP corners there (w is 15 bits: moving Z to saturation would take 2048 commands)."""
    cfg = replace(SMALL, ac_lanes=ac_lanes, intervals=intervals, cutoff=SMALL.cutoff if intervals > 1 else -12.0)
    corners = kind == "drift" and intervals > 1
    r = simulate("lad-ac", cfg, "testbenches.tb.tb_lad_ac", seed=seed, name=f"{kind}-{cfg.ac_group}-i{intervals}",
                 params={"steps": steps, "kind": kind, "probe": 0.5, "recip_corners": 0.2 if corners else 0,
                         "out_stall": 0.95 if ac_lanes else 0.3, "decoy": 0.2})
    assert r["mismatches"] == 0 and r["steps"] == steps, r["mismatch_list"]
    assert r["corrections"] > 0 and r["mode_change_updates"] > 0 and r["probes"] > 0 and r["qa_passes"] > 0
    assert r["nonzero_outputs"] > r["beats"] // 2
    assert (r["z_clamped"] > 0) == (kind != "drift" or corners)   # drift's Z <= 0 only at a corner
    assert (r["recip_corners"] > 0) == corners and (r["z_saturated"] > 0) == corners
    assert r["cmd_ready_while_out_pending"] == 0 and r["cmd_offered_while_out_pending"] > 0
    assert r["idle_while_out_pending"] == 0 and r["decoys"] > 0
    # a QA's pass serves its TERMS: one number of cycles (COMBINE, then Z), a pass (d / P rows x nb
    # beats) or more below a TERMS that runs the pass itself (after waiting for the A engine, or not)
    after_qa, alone = r["terms_cycles_after_qa"], r["terms_cycles_alone"]
    assert len(set(after_qa)) == 1 and min(alone) >= after_qa[0] + cfg.head_dim // cfg.ac_vpus * cfg.beats, r


@pytest.mark.parametrize("groups, group_lanes", [(1, 4), (4, 1), (3, 2)])
def test_lane_file_behaves_as_the_flat_register(groups, group_lanes):
    """hdl/lad/ac.py ``LaneFile`` (AC's N, B, C, D in LUT RAM) against a list of lanes: random
    group writes and beat / group reads (seed 2026, 400 cycles) at the address chosen the cycle
    before (``read_next``), a write landing at the end of the cycle after its request (registered
    per memory): a read in that cycle returns the old value, the cycle after it the new one; and
    it is memories, not flip-flops: its RTLIL has ``groups`` memory write ports and no flip-flops
    but the read address and each memory's write registers."""
    import random
    import re
    from amaranth import Module, Signal
    from amaranth.back import rtlil
    from amaranth.sim import Simulator
    from hdl.lad.ac import LaneFile
    beats, width = 4, 6
    m = Module()
    lf = LaneFile(m, "f", beats, groups, group_lanes, width)
    rb, rg = Signal(range(beats)), Signal(range(groups))
    wb, wg, wd, we = Signal(range(beats)), Signal(range(groups)), Signal(group_lanes * width), Signal()
    beat_out, group_out = Signal(groups * group_lanes * width), Signal(group_lanes * width)
    lf.read_next(m, rb, rg)
    m.d.comb += [beat_out.eq(lf.beat_word), group_out.eq(lf.group_word)]
    with m.If(we):
        lf.write(m, wb, wg, wd)
    il = rtlil.convert(m, ports=[rb, rg, wb, wg, wd, we, beat_out, group_out], emit_src=False)
    assert len(re.findall(r"cell \$memwr", il)) == groups
    dff_bits = sum(int(w) for w in re.findall(r"cell \$dff \S+\n\s+parameter \\WIDTH (\d+)", il))
    assert dff_bits == (len(lf.read_beat) + (len(lf.read_group) if groups > 1 else 0)
                        + groups * (len(lf.write_beat) + group_lanes * width + 1))

    lanes = [[0] * (groups * group_lanes) for _ in range(beats)]   # the flat register, per beat
    word = lambda b, g: sum(lanes[b][g * group_lanes + j] << (j * width) for j in range(group_lanes))
    rng = random.Random(2026)
    seen = {"same_word": 0, "nonzero": 0}

    async def bench(ctx):
        b = g = 0   # the address chosen in the cycle before (the register's reset value)
        pending = None   # the write requested in the cycle before: it lands at the end of this one
        for _ in range(400):
            write = rng.random() < 0.5
            w_b, w_g = (b, g) if rng.random() < 0.3 else (rng.randrange(beats), rng.randrange(groups))
            data = [rng.randrange(1 << width) for _ in range(group_lanes)]
            nb_, ng_ = rng.randrange(beats), rng.randrange(groups)
            ctx.set(rb, nb_), ctx.set(rg, ng_), ctx.set(wb, w_b), ctx.set(wg, w_g), ctx.set(we, write)
            ctx.set(wd, sum(v << (j * width) for j, v in enumerate(data)))
            assert ctx.get(group_out) == word(b, g)       # the old word, also while it is written
            assert ctx.get(beat_out) == sum(word(b, r) << (r * group_lanes * width) for r in range(groups))
            seen["same_word"] += write and (w_b, w_g) == (b, g)
            seen["nonzero"] += ctx.get(beat_out) != 0
            await ctx.tick()
            if pending:
                p_b, p_g, p_data = pending
                lanes[p_b][p_g * group_lanes:(p_g + 1) * group_lanes] = p_data
            pending = (w_b, w_g, data) if write else None
            b, g = nb_, ng_
    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen["same_word"] > 20 and seen["nonzero"] > 300
