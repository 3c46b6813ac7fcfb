"""``ladmac eval attncache --task mmlu`` (docs/results_attncache.md section 4): MMLU 0-5-shot with
SmolLM2, full model and AttnCache side by side: accuracy, speedups (ours and the authors' way), time
breakdown. ``--reuse prefix``: per subject the shared prompt prefix, whose map serves the prompt's
first P rows exactly; ``repeat``: the scored prompts themselves (section 4.1, the fastest a hit can
be); ``similar``: another question's maps (``attncache_mmlu_similar``, section 4.2)."""
from __future__ import annotations

import time
from pathlib import Path

from ..attncache import AttnCache, build_prefix_store
from ..errors import ConfigError, DataError
from .attncache_data import describe_mmlu, mmlu_questions, store_root
from .report import check_outputs, save_outputs, write_json

def mmlu_plots(result: dict, folder) -> list[str]:
    """Time breakdown (ms per question, baseline vs AttnCache) and per-subject speedups."""
    from .plots import pyplot
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"attncache_{result['model']}_mmlu{result['shots']}shot"
    ms = result["ms_per_question"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    parts = (("lookup", "tab:purple"), ("fetch", "tab:red"), ("attention", "tab:blue"), ("rest", "tab:gray"))
    for x, key in ((0, "full"), (1, "attncache")):
        bottom = 0.0
        for part, color in parts:
            val = ms[key].get(part, 0.0)
            ax.bar(x, val, bottom=bottom, color=color, label=part if x == 1 else None)
            bottom += val
    ax.set_xticks([0, 1])
    ax.set_xticklabels(["full model", "AttnCache"])
    ax.set_ylabel("ms per question (mean over all inputs)")
    ax.set_title(f"MMLU {result['shots']}-shot, {result['model']}, {result['threads']} thread(s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = [str(folder / f"{stem}_time.png")]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    subs = result["subjects"]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    xs = range(len(subs))
    ax.bar([x - 0.2 for x in xs], [s["attn_speedup"] for s in subs], 0.4, label="attention")
    ax.bar([x + 0.2 for x in xs], [s["e2e_speedup"] for s in subs], 0.4, label="end to end")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([s["subject"].replace("_", " ") for s in subs], rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("speedup over all inputs")
    ax.set_title(f"MMLU {result['shots']}-shot per subject")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    paths.append(str(folder / f"{stem}_speedup.png"))
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def _speedups(rows) -> dict:
    """Totals over ``rows`` (ratio of summed times = the per-input mean's ratio)."""
    import numpy as np

    def tot(key, mode):
        return float(np.sum([r[mode][key] for r in rows]))
    hits = [r for r in rows if r["cache"]["hit"]]
    out = {"attn_speedup": tot("attn_s", "full") / tot("attn_s", "cache"),
           "e2e_speedup": tot("t", "full") / tot("t", "cache")}
    out["attn_speedup_on_hits"] = (sum(r["full"]["attn_s"] for r in hits) / sum(r["cache"]["attn_s"] for r in hits)) \
        if hits else None
    out["e2e_speedup_on_hits"] = (sum(r["full"]["t"] for r in hits) / sum(r["cache"]["t"] for r in hits)) \
        if hits else None
    # the authors' convention (their public MMLU script): hits only, lookup and map loading left out
    out["e2e_speedup_authors"] = (sum(r["full"]["t"] for r in hits) / sum(
        r["cache"]["t"] - r["cache"]["lookup_s"] - r["cache"]["fetch_s"] for r in hits)) if hits else None
    return out


def run_mmlu(args, argv, cfg, thetas=()) -> int:
    """MMLU 0/5-shot with SmolLM2: a prefix store (``--reuse prefix``: per subject the header and the
    ``--shots`` dev exemplars every question of the subject starts with, whose map serves the prompt's
    first P rows exactly; ``repeat``: every scored prompt whole), then per test question the full model
    and AttnCache side by side (order alternating), choice = argmax of the answer-letter logits at the last position; accuracy, hit rate, attention and
    end-to-end times (all inputs, then hits only) and the time breakdown."""
    import numpy as np
    import torch
    from tqdm import tqdm
    from .data import MMLU_CHOICES, mmlu_subjects
    if args.model != "smollm2":
        raise ConfigError("--task mmlu runs with --model smollm2 (a causal LM with answer-letter logits)")
    if args.shots not in (0, 1, 2, 3, 4, 5):
        raise ConfigError(f"--shots must be 0..5 (the dev file holds 5 exemplars), got {args.shots}")
    if args.reuse not in ("prefix", "repeat", "similar"):
        raise ConfigError(f"--reuse must be prefix, repeat or similar, got '{args.reuse}'")
    if args.reuse == "similar" and args.shots != 0:
        raise ConfigError("--reuse similar runs at --shots 0 (the projector trains on every stored prompt's 30 "
                          "maps held in memory; a 5-shot prompt's are ~250 MB)")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    known = mmlu_subjects()
    subjects = known if not args.subjects else [s.strip() for s in args.subjects.split(",") if s.strip()]
    bad = [s for s in subjects if s not in known]
    if bad or not subjects:
        raise ConfigError(f"unknown MMLU subject(s) {', '.join(bad) or '(none given)'} (known: {', '.join(known)})")
    check_outputs(args.out, args.plot)
    print(f"data: {describe_mmlu(subjects)}")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from .smollm2 import load_smollm2
    model, tok = load_smollm2(dtype=torch.float32)
    base, head = model.model, model.lm_head
    load_s = time.perf_counter() - t0
    letters = [tok(" " + c).input_ids for c in MMLU_CHOICES]
    if any(len(ids) != 1 for ids in letters):
        raise DataError(f"answer letters are not single tokens: {letters}")
    letters = torch.tensor([ids[0] for ids in letters])

    def run_ids(ids):
        with torch.inference_mode():
            return base(input_ids=ids.view(1, -1)).last_hidden_state

    def answer(ids):
        with torch.inference_mode():
            hidden = base(input_ids=ids.view(1, -1)).last_hidden_state[:, -1]
            return head(hidden)[0, letters]

    if args.reuse == "similar":  # the split takes every test question; --limit caps the scored ones
        from .attncache_mmlu_similar import run_mmlu_similar
        data = mmlu_questions(tok, args.shots, subjects, None, cfg.seed)
        return run_mmlu_similar(args, argv, cfg, thetas, base, run_ids, answer, data, load_s)
    data = mmlu_questions(tok, args.shots, subjects, args.limit, cfg.seed)

    cache = AttnCache(base, cfg)
    result = {"model": args.model, "task": "mmlu", "shots": args.shots, "reuse": args.reuse,
              "command": "ladmac eval attncache " + " ".join(argv), "config": cfg.to_dict(), "threads": args.threads,
              "limit_per_subject": args.limit, "load_s": load_s}
    rows, per_subject = [], []
    with store_root(args.store, cache) as root:
        t0 = time.perf_counter()
        if args.reuse == "prefix":  # per subject its shared prefix: rows 0..P-1 of every prompt, exact
            keys, texts = [d[2] for d in data], [d[1] for d in data]
        else:  # every scored prompt itself: each hit is an exact repeat, all rows of all layers reused
            keys = [torch.cat([d[2], q]) for d in data for q, _ in d[3]]
            texts = None
        store = build_prefix_store(cache, run_ids, keys, root, progress=args.progress, texts=texts)
        result["build_s"] = time.perf_counter() - t0
        result["store_bytes"] = sum((root / e["file"]).stat().st_size for e in store.entries)
        cache.use_store(store)
        answer(data[0][2][:16])  # warm-up (first call allocations), untimed
        n = 0
        for subject, _, pids, items in data:
            srows = []
            for qids, gold in tqdm(items, desc=subject, disable=not args.progress, leave=False):
                ids = torch.cat([pids, qids])
                r = {"subject": subject, "len": int(ids.shape[0]), "prefix_len": int(pids.shape[0]), "gold": gold}
                for mode in (("off", "lookup") if n % 2 == 0 else ("lookup", "off")):
                    cache.mode = mode
                    t = time.perf_counter()
                    logits = answer(ids)
                    t = time.perf_counter() - t
                    last = cache.last
                    r["full" if mode == "off" else "cache"] = {
                        "t": t, "attn_s": last["attn_s"], "lookup_s": last["lookup_s"], "fetch_s": last["fetch_s"],
                        "hit": bool(last["hit"]), "rows_reused": int(last.get("rows_reused", 0)),
                        "pred": MMLU_CHOICES[int(logits.argmax())], "logits": [float(x) for x in logits]}
                cache.mode = "off"
                r["max_logit_diff"] = float(np.max(np.abs(np.subtract(r["full"]["logits"], r["cache"]["logits"]))))
                srows.append(r)
                n += 1
            rows += srows
            per_subject.append({"subject": subject, "questions": len(srows), "prefix_len": int(pids.shape[0]),
                                "mean_len": float(np.mean([r["len"] for r in srows])),
                                "acc_full": 100.0 * np.mean([r["full"]["pred"] == r["gold"] for r in srows]),
                                "acc_cache": 100.0 * np.mean([r["cache"]["pred"] == r["gold"] for r in srows]),
                                **_speedups(srows)})
            s = per_subject[-1]
            print(f"  {subject}: {len(srows)} questions, len {s['mean_len']:.0f} (prefix {s['prefix_len']}), "
                  f"acc {s['acc_full']:.1f} -> {s['acc_cache']:.1f}, attention {s['attn_speedup']:.2f}x, "
                  f"end to end {s['e2e_speedup']:.2f}x", flush=True)
            if args.out:  # as it goes
                write_json(args.out, dict(result, partial=True, subjects=per_subject, rows=rows))
    hits = np.array([r["cache"]["hit"] for r in rows])
    # an input whose exact text is stored: its ids equal a stored entry's (the entries are the prefixes)
    exact = np.array([r["cache"]["hit"] and r["cache"]["rows_reused"] == r["len"] for r in rows])

    def ms(mode):
        m = {k: 1e3 * float(np.mean([r[mode][k + "_s"] for r in rows])) for k in ("lookup", "fetch", "attn")}
        m["e2e"] = 1e3 * float(np.mean([r[mode]["t"] for r in rows]))
        m["attention"] = m.pop("attn")
        m["rest"] = m["e2e"] - m["attention"] - m["lookup"] - m["fetch"]
        return m
    acc_full = 100.0 * float(np.mean([r["full"]["pred"] == r["gold"] for r in rows]))
    acc_cache = 100.0 * float(np.mean([r["cache"]["pred"] == r["gold"] for r in rows]))
    result.update({
        "questions": len(rows), "mean_len": float(np.mean([r["len"] for r in rows])),
        "mean_rows_reused_frac": float(np.mean([r["cache"]["rows_reused"] / r["len"] for r in rows])),
        "accuracy_full": acc_full, "accuracy_attncache": acc_cache, "delta": acc_cache - acc_full,
        "predictions_changed": int(sum(r["full"]["pred"] != r["cache"]["pred"] for r in rows)),
        "max_logit_diff": float(max(r["max_logit_diff"] for r in rows)),
        "hit_rate": float(hits.mean()), "hit_rate_new_text": float((hits & ~exact).mean()),
        **_speedups(rows), "ms_per_question": {"full": ms("full"), "attncache": ms("cache")},
        "crc_s": store.crc_s, "subjects": per_subject, "rows": rows})
    print(f"MMLU {args.shots}-shot, {args.model}, {len(rows)} questions ({len(subjects)} subjects, "
          f"mean length {result['mean_len']:.0f} tokens, {result['mean_rows_reused_frac']:.0%} of rows reused), "
          f"{args.threads} thread(s)")
    print(f"accuracy full {acc_full:.2f} %, AttnCache {acc_cache:.2f} % ({result['delta']:+.2f}; "
          f"{result['predictions_changed']} predictions changed, max letter-logit difference "
          f"{result['max_logit_diff']:.2e}); hit rate {result['hit_rate']:.1%} (new text {result['hit_rate_new_text']:.1%})")
    print(f"speedup over all inputs: attention {result['attn_speedup']:.2f}x, end to end {result['e2e_speedup']:.2f}x; "
          f"hits only: attention {result['attn_speedup_on_hits'] or 0:.2f}x, end to end "
          f"{result['e2e_speedup_on_hits'] or 0:.2f}x; the authors' way (hits only, lookup and map loading left "
          f"out): end to end {result['e2e_speedup_authors'] or 0:.2f}x")
    for key in ("full", "attncache"):
        print(f"ms per question, {key}: " + ", ".join(f"{k} {v:.1f}" for k, v in result["ms_per_question"][key].items()))
    save_outputs(result, args, mmlu_plots)
    return 0
