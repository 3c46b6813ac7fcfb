"""MAC decode engine RTL (hdl/mac/decode.py) under Verilator == the bit-accurate model
golden.mac_decode.MacDecodeHead, per head, on every output beat (m, s, o) and statistics beat
(engaged, hit, matched position and distance, fallback, keys read): random sequences at ``tiny``
(two heads, 30 steps = 3.75 windows: steps before min_context, hits, misses, cancelled removals
with their fallback, ring and entry-store wrap) with band-0 and (two sinks, band 3, min_context 1)
variants and with a third of the steps' ``reuse`` bit off (a layer in ``full_layers``), a band
longer than the context (at one beat per vector and the guard and output formats
where one LSB of the numerator shows in o), and real SmolLM2 decode steps; random latency and back-pressure on every stream (tb_mac_decode). Also the
RTL's cycles of every step == golden.mac_decode.engine_step_cycles (its FSM's schedule) with no
stalls but back-pressure on ``out``."""
from dataclasses import replace
from pathlib import Path

import pytest

from golden.errors import ConfigError
from golden.mac_decode import PRESETS, MacDecodeConfig
from hdl.mac.decode import attend_vpu
from testbenches.runner import simulate

TINY = PRESETS["tiny"]            # window 8, d 8, lanes 4, band 4, min_context 10, 2 heads
VARIANTS = {"tiny": TINY, "band0": replace(TINY, band=0),
            # engaged from the first step (an empty ring at n = 0), two sinks, band 3
            "early": replace(TINY, min_context=1, sinks=2, band=3)}
TRACE = Path(__file__).parent / "data" / "smollm2_mac_trace.pt"
# a trace config small enough for the bench: M = 32, S = 8, d = 64 in 8 beats of 8 lanes, 80 steps
TRACE_CFG = MacDecodeConfig(window=32, band=8, min_context=40, sinks=0, heads=1, lanes=8, max_positions=128)


def _summary(name, r):
    rtl, model = r["rtl_cycles"], r["model_cycles"]
    print(f"\n{name}: {r['steps']} head-steps, {r['beats']} beats compared, {r['mismatches']} mismatches; "
          f"{r['hits']} hits, {r['misses']} misses, {r['fallbacks']} fallbacks, {r['idle']} not engaged (before min_context or reuse off); "
          f"cycles/step RTL {sum(rtl) / len(rtl):.0f}, engine schedule {sum(r['engine_cycles']) / len(rtl):.0f}, "
          f"planned schedule {sum(model) / len(model):.0f}")


@pytest.mark.parametrize("variant, seed, reuse_off", [("tiny", 2025, 0.0), ("tiny", 2026, 0.0), ("band0", 2026, 0.0),
                                                     ("early", 2026, 0.0), ("early", 2028, 0.33)])
def test_mac_decode_rtl_equals_model_on_random_sequences(variant, seed, reuse_off):
    cfg = VARIANTS[variant]
    steps, heads = 30, 2
    r = simulate("mac-decode", cfg, seed=seed, name=f"{variant}-reuse-off" if reuse_off else variant,
                 params={"steps": steps, "heads_used": heads, "seq_seed": seed, "reuse_off": reuse_off})
    _summary(f"{variant} seed {seed}", r)
    assert r["mismatches"] == 0 and r["steps"] == steps * heads
    assert r["beats"] == steps * heads * (cfg.beats + 1)
    assert (r["reuse_off"] >= 10) == (reuse_off > 0), r["reuse_off"]
    # no match below min_context, nor on a step with reuse off
    assert r["idle"] == heads * (cfg.min_context - 1) + r["reuse_off"]
    assert r["hits"] >= 5 and r["misses"] >= 5, r               # both paths, many times
    if variant != "band0":                                      # band 0: no tail to remove
        assert r["fallbacks"] >= 1, r
    assert r["nonzero_outputs"] > r["steps"] * cfg.beats // 2


# The band test's config is also the bench's narrow-guard, fine-output, single-beat one (it kills
# mutants no other config reaches, docs/verification.md): d = lanes (one beat: the query's first beat is its last);
# sum_frac 16 (attend_guard = sum_frac, so kr == guard, pre = 0, when one key dominates); out_frac =
# kv_frac + 16 (out_shift = 16 = mantissa_frac: one unit of round_shift(N, pre) moves o by r / 2^16,
# one or two LSBs, where the default formats hide it below o's rounding)
FINE = replace(TINY, band=1000, lanes=8, sum_frac=16, kv_width=8, kv_frac=4, out_width=24, out_frac=20)


def test_mac_decode_rtl_equals_model_with_a_band_past_the_context():
    """band 1000 > 4 max_positions: every key is the tail's (lo_tail = F, a hit's band empty).
    Before the RTL clamped the band to max_positions, L - band wrapped in its signed W + 2 bits and
    the engine asked for keys past the context. At FINE's formats and single beat."""
    cfg = FINE
    assert cfg.beats == 1 and cfg.attend_guard == cfg.sum_frac and cfg.out_shift == cfg.mantissa_frac
    steps = 20
    r = simulate("mac-decode", cfg, seed=2027, name="band-past-context",
                 params={"steps": steps, "heads_used": 1, "seq_seed": 2027})
    _summary("band 1000, seed 2027", r)
    assert r["mismatches"] == 0 and r["steps"] == steps and r["beats"] == steps * (cfg.beats + 1)
    assert r["hits"] >= 1 and r["misses"] >= 1 and r["fallbacks"] == 0, r   # no body to remove
    assert r["nonzero_outputs"] > r["steps"] * cfg.beats // 2


def test_mac_decode_rtl_equals_model_from_a_later_first_position():
    """The engine takes over at position 13 (as after a prompt processed elsewhere: positions
    0..12 only in the KV memory), its rings empty there: the slots count the head's steps from
    13, a match's position is the step's less the steps back to it (13 is no multiple of the
    window, so slots and positions differ mod window). Model == RTL, cycles == the schedule."""
    cfg = VARIANTS["early"]
    start, steps, heads = 13, 24, 2
    r = simulate("mac-decode", cfg, seed=2029, name="start13",
                 params={"steps": steps, "heads_used": heads, "seq_seed": 2029, "start": start,
                         "gap": 0.0, "stall": 0.0, "latency": [1, 1]})
    _summary(f"early from position {start}", r)
    assert r["mismatches"] == 0 and r["steps"] == steps * heads
    assert r["hits"] >= 5 and r["misses"] >= 5 and r["idle"] == 0, r
    assert r["rtl_cycles"] == r["engine_cycles"]
    assert r["nonzero_outputs"] > r["steps"] * cfg.beats // 2


def test_mac_decode_rtl_equals_model_on_real_smollm2_steps():
    r = simulate("mac-decode", TRACE_CFG, seed=7, name="trace",
                 params={"trace": str(TRACE), "steps": 80, "latency": [1, 4]})
    _summary("SmolLM2 layer 12 head 0", r)
    assert r["mismatches"] == 0 and r["steps"] == 80
    assert r["hits"] >= 10 and r["misses"] >= 20, r
    assert r["idle"] == TRACE_CFG.min_context - 1


@pytest.mark.parametrize("variant, out_stall", [("tiny", 0.0), ("early", 0.5)])
def test_mac_decode_rtl_cycles_equal_the_engine_schedule(variant, out_stall):
    """No gaps, KV / entry latency 1, back-pressure on ``out`` alone (early: half its cycles, which
    the statistic leaves out): the RTL's cycles of every step (query beat to statistics beat) ==
    golden.mac_decode.engine_step_cycles, its FSM's states one after another (idle steps, hits,
    misses, cancelled removals; tiny: no sinks, early: two, an empty ring at n = 0). Printed next
    to head_step_cycles, the planned schedule: the RTL is slower (steps not overlapped, per-range
    RECIP, the tail read again for the body)."""
    cfg = VARIANTS[variant]
    r = simulate("mac-decode", cfg, seed=2025, name=f"cycles-{variant}",
                 params={"steps": 30, "heads_used": 2, "seq_seed": 2025, "gap": 0.0, "stall": 0.0, "latency": [1, 1],
                         "out_stall": out_stall})
    _summary(f"{variant}, out stalled {out_stall}", r)
    assert r["mismatches"] == 0
    rtl, engine = r["rtl_cycles"], r["engine_cycles"]
    assert len(rtl) == len(engine) == 60 and min(rtl) > 0
    wrong = [(i // 2, i % 2, kind, a, b) for i, (a, b, kind) in enumerate(zip(rtl, engine, r["kinds"])) if a != b]
    assert not wrong, f"{len(wrong)} steps off the schedule (step, head, kind, RTL, model): {wrong[:5]}"
    assert {"hit", "miss"} <= set(r["kinds"]) and ("idle" in r["kinds"]) == (cfg.min_context > 1), r["kinds"]
    assert (r["out_waits"] > 20) == (out_stall > 0), r["out_waits"]    # the stalls happened (and only then)


def test_mac_decode_engine_rejects_configs_it_cannot_build():
    with pytest.raises(ConfigError, match="mac-decode"):
        attend_vpu(replace(TINY, sum_width=44, sum_frac=30))     # what MacDecodeEngine() checks first
