"""``ladmac eval attncache --task mmlu --reuse similar`` (docs/results_attncache.md section 4.2):
reuse of a *different* stored question's maps. Per subject the test questions are split (seeded):
the store holds ``STORE_FRAC`` of them, the next ``CALIB_FRAC`` choose theta, the rest are scored
(never in the store). The store is the projector route of algorithms.md section 3 (layer-0 input
pooled, projector trained on map-distance labels, faiss index, nearest equal-length candidate);
per scored question the full model, AttnCache at theta and the forced candidate run side by side,
so every theta of the sweep is composed exactly from the same run."""
from __future__ import annotations

import time
from collections import Counter

from ..attncache import AttnCache, build_store
from .attncache_data import store_root
from .attncache_sentences import calibrated_theta
from .report import save_outputs

STORE_FRAC, CALIB_FRAC = 0.4, 0.1


def split_questions(data, seed: int):
    """Per subject (seeded permutation): STORE_FRAC -> store, CALIB_FRAC -> calibration, the rest
    scored. -> (store, calib, scored), each a list of (subject, prompt ids, answer letter)."""
    import numpy as np
    import torch
    parts = ([], [], [])
    for subject, _, pids, items in data:
        order = np.random.default_rng(seed).permutation(len(items))
        n_store, n_calib = round(STORE_FRAC * len(items)), round(CALIB_FRAC * len(items))
        for rank, i in enumerate(order):
            part = 0 if rank < n_store else 1 if rank < n_store + n_calib else 2
            q, a = items[i]
            parts[part].append((subject, torch.cat([pids, q]), a))
    return parts


def side_by_side(cache, answer, questions, modes, progress: bool, desc: str) -> list[dict]:
    """Per question each mode once (order rotating), timed wall clock from ids to the letter logits."""
    from tqdm import tqdm
    from .data import MMLU_CHOICES
    rows = []
    for n, (subject, ids, gold) in enumerate(tqdm(questions, desc=desc, disable=not progress, leave=False)):
        r = {"subject": subject, "len": int(ids.shape[0]), "gold": gold}
        k = n % len(modes)
        for mode in modes[k:] + modes[:k]:
            cache.mode = mode
            t = time.perf_counter()
            logits = answer(ids)
            t = time.perf_counter() - t
            last = cache.last
            r[mode] = {"t": t, "attn_s": last["attn_s"], "lookup_s": last["lookup_s"], "fetch_s": last["fetch_s"],
                       "hit": bool(last["hit"]), "entry": int(last["entry"]), "sim": float(last["sim"]),
                       "pred": MMLU_CHOICES[int(logits.argmax())]}
        cache.mode = "off"
        rows.append(r)
    return rows


def sweep(rows, thetas) -> list[dict]:
    """Per theta, composed from the same run: a hit takes the forced candidate's prediction and time,
    a miss the full model's prediction and its time plus the lookup's."""
    import numpy as np
    full_acc = 100.0 * np.mean([r["off"]["pred"] == r["gold"] for r in rows])
    out = []
    for th in thetas:
        hit = [r["force"]["hit"] and r["force"]["sim"] >= th for r in rows]
        pred = [r["force"]["pred"] if h else r["off"]["pred"] for r, h in zip(rows, hit)]
        t_cache = sum(r["force"]["t"] if h else r["off"]["t"] + r["force"]["lookup_s"] for r, h in zip(rows, hit))
        acc = 100.0 * np.mean([p == r["gold"] for p, r in zip(pred, rows)])
        out.append({"theta": th, "hit_rate": float(np.mean(hit)), "accuracy": acc, "delta": acc - full_acc,
                    "predictions_changed": int(sum(p != r["off"]["pred"] for p, r in zip(pred, rows))),
                    "e2e_speedup": sum(r["off"]["t"] for r in rows) / t_cache})
    return out


def totals(rows, mode: str) -> dict:
    """Accuracy, hit rate and speedups of ``mode`` against the full model over ``rows``: ours (all
    inputs, lookup and map loading included) and the authors' (hits only, lookup and loading out)."""
    import numpy as np
    hits = [r for r in rows if r[mode]["hit"]]

    def tsum(rs, key, m):
        return float(sum(r[m][key] for r in rs))
    out = {"questions": len(rows), "hit_rate": len(hits) / len(rows),
           "accuracy_full": 100.0 * float(np.mean([r["off"]["pred"] == r["gold"] for r in rows])),
           "accuracy_attncache": 100.0 * float(np.mean([r[mode]["pred"] == r["gold"] for r in rows])),
           "predictions_changed": int(sum(r[mode]["pred"] != r["off"]["pred"] for r in rows)),
           "e2e_speedup": tsum(rows, "t", "off") / tsum(rows, "t", mode),
           "attn_speedup": tsum(rows, "attn_s", "off") / tsum(rows, "attn_s", mode),
           "ms_per_question": {m: {"e2e": 1e3 * tsum(rows, "t", m) / len(rows),
                                   "attention": 1e3 * tsum(rows, "attn_s", m) / len(rows),
                                   "lookup": 1e3 * tsum(rows, "lookup_s", m) / len(rows),
                                   "fetch": 1e3 * tsum(rows, "fetch_s", m) / len(rows)} for m in ("off", mode)}}
    out["delta"] = out["accuracy_attncache"] - out["accuracy_full"]
    if hits:
        out["authors_e2e_speedup"] = tsum(hits, "t", "off") / sum(
            r[mode]["t"] - r[mode]["lookup_s"] - r[mode]["fetch_s"] for r in hits)
        out["authors_attn_speedup"] = tsum(hits, "attn_s", "off") / tsum(hits, "attn_s", mode)
    return out


def run_mmlu_similar(args, argv, cfg, thetas, base, run_ids, answer, data, load_s: float) -> int:
    """Store / calibration / scored split, projector store, theta from the calibration split, then the
    scored questions side by side (full, AttnCache at theta, forced candidate). ``run_ids`` and
    ``answer`` are run_mmlu's: the model ``base`` on one prompt, and its answer-letter logits."""
    stored, calib, scored = split_questions(data, cfg.seed)
    if args.limit is not None:  # the first --limit scored questions of each subject
        seen, capped = Counter(), []
        for q in scored:
            seen[q[0]] += 1
            if seen[q[0]] <= args.limit:
                capped.append(q)
        scored = capped
    print(f"split: {len(stored)} stored questions, {len(calib)} calibration, {len(scored)} scored "
          f"(per subject {STORE_FRAC:.0%} / {CALIB_FRAC:.0%} / the rest, seed {cfg.seed}; no scored question is stored)")
    cache = AttnCache(base, cfg)
    result = {"model": args.model, "task": "mmlu", "shots": args.shots, "reuse": "similar",
              "command": "ladmac eval attncache " + " ".join(argv), "config": cfg.to_dict(), "threads": args.threads,
              "load_s": load_s, "stored": len(stored), "calib_questions": len(calib), "scored": len(scored)}
    modes = ["off", "lookup", "force"]
    with store_root(args.store, cache) as root:
        t0 = time.perf_counter()
        store = build_store(cache, run_ids, [q[1] for q in stored], root, progress=args.progress)
        result["build_s"] = time.perf_counter() - t0
        result["store_bytes"] = sum((root / e["file"]).stat().st_size for e in store.entries)
        print(f"store: {len(stored)} questions, {result['store_bytes'] / 2**30:.2f} GiB of maps "
              f"(layers {cfg.layers}), built in {result['build_s']:.0f} s", flush=True)
        cache.use_store(store)
        answer(scored[0][1][:16])  # warm-up, untimed
        theta = cfg.theta
        if calib:
            crow = side_by_side(cache, answer, calib, ["off", "force"], args.progress, "calibration")
            result["calibration"] = {"metric": "accuracy", "sweep": sweep(crow, thetas)}
            theta = calibrated_theta(result["calibration"], thetas, args.calib_drop, len(calib), "questions")
        cache.use_store(store, theta)
        result["theta_used"] = theta
        rows = side_by_side(cache, answer, scored, modes, args.progress, "scored")
        for r in rows:
            if r["lookup"]["hit"] != (r["force"]["hit"] and r["force"]["sim"] >= theta):
                raise RuntimeError(f"lookup and forced candidate disagree on a {r['subject']} question")
    stored_ids = {tuple(q[1].tolist()) for q in stored}
    for r, q in zip(rows, scored):
        r["text_stored"] = tuple(q[1].tolist()) in stored_ids
    result.update(totals(rows, "lookup"), sweep=sweep(rows, thetas), rows=rows)
    result["hit_rate_new_text"] = sum(r["lookup"]["hit"] and not r["text_stored"] for r in rows) / len(rows)
    print(f"MMLU {args.shots}-shot, {args.model}, reuse of a different stored question, theta {theta:g}, "
          f"{len(rows)} scored questions, {args.threads} thread(s)")
    print(f"accuracy full {result['accuracy_full']:.2f} %, AttnCache {result['accuracy_attncache']:.2f} % "
          f"({result['delta']:+.2f}; {result['predictions_changed']} predictions changed); hit rate "
          f"{result['hit_rate']:.1%}, of a question whose text is not the scored one's {result['hit_rate_new_text']:.1%}")
    print(f"ours (all inputs, lookup and map loading included): end to end {result['e2e_speedup']:.2f}x, attention "
          f"{result['attn_speedup']:.2f}x")
    if "authors_e2e_speedup" in result:
        print(f"the authors' way (hits only, lookup and map loading left out): end to end "
              f"{result['authors_e2e_speedup']:.2f}x, attention {result['authors_attn_speedup']:.2f}x")
    for m, v in result["ms_per_question"].items():
        print(f"ms per question, {'full' if m == 'off' else 'attncache'}: " + ", ".join(f"{k} {x:.1f}" for k, x in v.items()))
    print("theta sweep (same run): theta, hit rate, accuracy, delta, predictions changed, end to end x")
    for s in result["sweep"]:
        print(f"  {s['theta']:>6g} {s['hit_rate']:6.1%} {s['accuracy']:6.2f} {s['delta']:+6.2f} "
              f"{s['predictions_changed']:4d} {s['e2e_speedup']:5.2f}")
    save_outputs(result, args, similar_plots)
    return 0


def similar_plots(result: dict, folder) -> list[str]:
    """Accuracy change and end-to-end speedup (all inputs) against the hit rate, one point per theta."""
    from pathlib import Path
    from .plots import pyplot
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = result["sweep"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    hit = [100 * r["hit_rate"] for r in rows]
    ax1.plot(hit, [r["delta"] for r in rows], "o-")
    ax1.axhline(-1.0, color="gray", ls="--", lw=0.8)
    ax1.set_xlabel("hits (% of scored questions)")
    ax1.set_ylabel("accuracy change (points)")
    ax2.plot(hit, [r["e2e_speedup"] for r in rows], "o-")
    ax2.axhline(1.25, color="gray", ls="--", lw=0.8)
    ax2.set_xlabel("hits (% of scored questions)")
    ax2.set_ylabel("end-to-end speedup, all inputs")
    for ax in (ax1, ax2):
        ax.axvline(100 * result["hit_rate"], color="tab:red", lw=0.8)
    fig.suptitle(f"MMLU {result['shots']}-shot, {result['model']}: another question's maps "
                 f"(theta {result['theta_used']:g} marked)", fontsize=9)
    fig.tight_layout()
    path = folder / f"attncache_{result['model']}_mmlu{result['shots']}shot_similar.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]
