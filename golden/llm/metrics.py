"""Scores of a decoding run: ROUGE-L on token ids, perplexity, and the run-level stats of a
:class:`golden.llm.hooks.Controller` (LAD: active / candidate / read fractions, centers;
MAC: hit rate, skip ratio, fallbacks)."""
from __future__ import annotations

import math


def lcs_length(a, b) -> int:
    """Length of the longest common subsequence of two sequences (O(len(a) len(b)) DP)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate, reference) -> float:
    """ROUGE-L F1 (beta = 1) between two token sequences: 2 P R / (P + R) with P = LCS/|cand|, R = LCS/|ref|."""
    lcs = lcs_length(list(candidate), list(reference))
    if lcs == 0:
        return 0.0
    p, r = lcs / len(candidate), lcs / len(reference)
    return 2 * p * r / (p + r)


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))


def generation_scores(out: list[int], ref: list[int]) -> dict:
    """ROUGE-L F1, exact token agreement and index of the first differing token of a greedy
    continuation ``out`` against the full-attention one ``ref``."""
    agree = sum(a == b for a, b in zip(out, ref)) / len(ref)
    first = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), len(ref))
    return {"rouge_l": rouge_l(out, ref), "token_agreement": agree, "first_divergence": first}


LAST_STEPS = 512   # the KV-read figure of issue 12 is averaged over the last 512 decode steps


def read_last_steps(steps: list[dict], last: int) -> dict:
    """Keys and values read as % of dense over the last ``last`` decode steps (all layers and heads),
    and for the LAD tile its cycles as % of the dense baseline's (``golden.lad_tile.schedule_cycles``):
    a step's dense reads are its positions times its KV readers (``readers``: one per tile, a tile
    serving ``group`` heads reads a position once for all; ``heads`` where not given), summed per layer
    (each step record sums ``positions`` and ``readers`` over its ``layer_steps`` layers, which all
    hold the same count)."""
    tail = [s for s in steps[-last:] if s.get("layer_steps") and "keys_read" in s]
    dense = sum(s["positions"] * s.get("readers", s["heads"]) / s["layer_steps"] for s in tail)
    if not dense:
        return {}
    out = {f"keys_read_last{last}_pct": 100.0 * sum(s["keys_read"] for s in tail) / dense,
           f"values_read_last{last}_pct": 100.0 * sum(s["values_read"] for s in tail) / dense}
    if all("tile_cycles" in s for s in tail):   # the LAD tile: its schedule's cycles vs the dense baseline's
        out[f"cycles_last{last}_pct"] = 100.0 * sum(s["tile_cycles"] for s in tail) / sum(s["dense_cycles"] for s in tail)
    return out


def summarize(ctl) -> dict:
    """Run-level stats of the controller's method (``ctl``: a :class:`golden.llm.hooks.Controller`)."""
    t = ctl.totals
    if ctl.method in ("lad", "lad-tile") and t.get("positions"):
        hp = t["positions"]  # sum over layer-steps of positions (x heads below)
        heads = t["heads"] / max(1, t["layer_steps"])
        pos_heads = hp * heads
        pos_readers = hp * t.get("readers", t["heads"]) / max(1, t["layer_steps"])   # KV streams: tiles
        centers = [int(s.n_centers.float().mean()) for s in ctl.states.values()]
        lengths = [s.length for s in ctl.states.values()]
        return {
            "active_pct": 100.0 * t["active"] / pos_heads,
            "candidates_pct": 100.0 * t["candidates"] / pos_heads,
            "false_alarm_pct": 100.0 * t["false_alarms"] / pos_heads,
            **({"missed_pct": 100.0 * t["missed"] / pos_heads} if "missed" in t else {}),
            **({"saturated_elements": t["saturated"]} if "saturated" in t else {}),
            **({"z_clamped_steps": t["z_clamped"]} if "z_clamped" in t else {}),
            "mode_changes_pct": 100.0 * t["mode_changes"] / pos_heads,
            "keys_read_pct": 100.0 * t["keys_read"] / pos_readers,
            "values_read_pct": 100.0 * t["values_read"] / pos_readers,
            **read_last_steps(ctl.steps, LAST_STEPS),
            "centers_per_head_mean": sum(c for c in centers) / max(1, len(centers)),
            "positions_at_end": max(lengths) if lengths else 0,
            "centers_per_head_min": min(int(s.n_centers.min()) for s in ctl.states.values()),
            "centers_per_head_max": max(int(s.n_centers.max()) for s in ctl.states.values()),
            "layer_steps": t["layer_steps"],
        }
    if ctl.method in ("mac", "mac-decode") and t.get("heads"):
        engaged = [s for s in ctl.steps if s.get("misses", 0) + s.get("hits", 0) > 0]
        eh = sum(s["heads"] for s in engaged)
        return {
            "hit_rate": t["hits"] / eh if eh else 0.0,
            "skip_ratio": 1.0 - t["kv_read"] / t["kv_total"],
            "skip_ratio_engaged": (1.0 - sum(s["kv_read"] for s in engaged) / sum(s["kv_total"] for s in engaged))
            if engaged else 0.0,
            **({"head_skip_ratio": 1.0 - t["head_kv_read"] / t["head_kv_total"]} if "head_kv_read" in t else {}),
            "fallbacks": t["fallbacks"], "engaged_steps": len(engaged), "steps": len(ctl.steps),
            "layer_steps": t["layer_steps"],
            **({"saturated_elements": t["saturated"], "kv_bytes": t["kv_bytes"], "entry_bytes": t["entry_bytes"],
                "dense_kv_bytes": t["dense_kv_bytes"], "engine_cycles": t["engine_cycles"],
                "dense_cycles": t["dense_cycles"], "cycles_vs_dense": t["engine_cycles"] / t["dense_cycles"]}
               if "kv_bytes" in t else {}),
        }
    return {"layer_steps": t.get("layer_steps", 0)}
