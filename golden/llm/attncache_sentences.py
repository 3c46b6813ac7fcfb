"""The AttnCache sentence tasks of ``ladmac eval attncache`` (docs/results_attncache.md sections
2.1-2.3): a sentence encoder (MiniLM mean pooling; SmolLM2 prompt-based, ``This sentence: "..."
means in one word:"``, last token's final hidden state), the side-by-side evaluation of the full
model, AttnCache at ``theta`` and the forced nearest candidate (which gives every other theta of
the sweep exactly: the candidate does not depend on theta), theta's calibration on held-out data,
and the two tasks: STS-B dev (Spearman x100 of cosine similarity vs gold) and SST-2 dev (accuracy
of a logistic-regression probe on the embeddings)."""
from __future__ import annotations

import time
from pathlib import Path

from ..attncache import AttnCache, build_store
from ..errors import ConfigError
from ..paths import data_file, describe_data_file
from .attncache_data import (SST2, STSB, calib_test_split, load_sst2, load_stsb, split_pairs,
                             store_root)
from .plots import attncache_plots
from .report import check_outputs, save_outputs

PROMPT = 'This sentence: "{}" means in one word:"'


class Encoder:
    """A model, the module AttnCache attaches to, and ``embed(sentence) -> 1-D tensor``."""

    def __init__(self, name: str):
        import torch
        self.name = name
        if name == "minilm":
            from .minilm import load_minilm, mean_pool
            self.model, self.tok = load_minilm()
            self.base = self.model
            self._pool = mean_pool
        elif name == "smollm2":
            from .smollm2 import load_smollm2
            self.model, self.tok = load_smollm2(dtype=torch.float32)
            self.model.eval()
            self.base = getattr(self.model, "model", self.model)
        else:
            raise ConfigError(f"unknown model '{name}' (known: minilm, smollm2)")

    def text(self, sentence: str) -> str:
        return PROMPT.format(sentence) if self.name == "smollm2" else sentence

    def embed(self, sentence: str):
        return self.embed_batch([sentence])[0]

    def embed_batch(self, sentences: list[str]):
        """(B, hidden) embeddings of a right-padded batch (AttnCache reads the lengths from its mask)."""
        import torch
        self.tok.padding_side = "right"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        batch = self.tok([self.text(s) for s in sentences], return_tensors="pt", padding=True)
        with torch.inference_mode():
            if self.name == "minilm":
                out = self.base(**batch).last_hidden_state
                return self._pool(out, batch["attention_mask"])
            out = self.base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            last = batch["attention_mask"].sum(1) - 1
            return out[torch.arange(len(sentences)), last].clone()


def fit_probe(x, y, l2: float = 1e-2, steps: int = 200):
    """Logistic-regression probe on standardised embeddings (LBFGS, L2); returns predict(x) -> 0/1."""
    import torch
    x = torch.stack([t.clone() for t in x]).double()
    y = torch.as_tensor(y, dtype=torch.float64)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * (w ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    w, b = w.detach(), b.detach()

    def predict(xs):
        return (((torch.stack(list(xs)).double() - mean) / std) @ w + b > 0).long()
    return predict


def spearman_x100(emb: dict, pairs) -> float:
    import torch
    from scipy.stats import spearmanr
    cos = [float(torch.cosine_similarity(emb[s1], emb[s2], dim=0)) for _, s1, s2 in pairs]
    return 100.0 * float(spearmanr(cos, [g for g, _, _ in pairs]).statistic)


def evaluate(enc: Encoder, cache, store, test_pairs, theta: float, thetas, progress: bool = True,
             sentences=None, score=None, metric: str = "spearman") -> dict:
    """Per unique test sentence: full / AttnCache at theta / forced candidate, timed side by side.
    ``score(embeddings) -> float`` (default: STS-B Spearman x100 of ``test_pairs``) is reported as
    ``metric``; ``sentences`` default to those of ``test_pairs``."""
    import numpy as np
    from tqdm import tqdm
    if sentences is None:
        sentences = list(dict.fromkeys(s for _, a, b in test_pairs for s in (a, b)))
    if score is None:
        def score(emb):
            return spearman_x100(emb, test_pairs)
    cache.use_store(store, theta)
    rec = {}
    for n, s in enumerate(tqdm(sentences, desc="evaluate", disable=not progress, leave=False)):
        r = {}
        order = ("off", "lookup", "force") if n % 3 == 0 else ("lookup", "force", "off") if n % 3 == 1 \
            else ("force", "off", "lookup")
        for mode in order:
            cache.mode = mode
            t0 = time.perf_counter()
            emb = enc.embed(s)
            r[mode] = dict(emb=emb, t=time.perf_counter() - t0, **{k: v for k, v in cache.last.items()})
        cache.mode = "off"
        if r["lookup"]["hit"] != (r["force"]["hit"] and r["force"]["sim"] >= theta):
            raise RuntimeError(f"lookup and forced candidate disagree on '{s}'")
        rec[s] = r
    in_db = set(store.manifest.get("texts", []))

    full_emb = {s: r["off"]["emb"] for s, r in rec.items()}
    full_sp = score(full_emb)
    sims = np.array([r["force"]["sim"] for r in rec.values()])
    t_full = np.array([r["off"]["t"] for r in rec.values()])
    a_full = np.array([r["off"]["attn_s"] for r in rec.values()])
    t_hit = np.array([r["force"]["t"] for r in rec.values()])
    a_hit = np.array([r["force"]["attn_s"] for r in rec.values()])
    lookup = np.array([r["force"]["lookup_s"] for r in rec.values()])
    exact = np.array([s in in_db for s in rec])

    def row(th):
        hits = sims >= th
        emb = {s: (r["force"]["emb"] if h else r["off"]["emb"]) for (s, r), h in zip(rec.items(), hits)}
        t_cache = np.where(hits, t_hit, t_full + lookup)
        a_cache = np.where(hits, a_hit, a_full)
        sp = score(emb)
        return {"theta": th, "hit_rate": float(hits.mean()), "hits": int(hits.sum()),
                "exact_text_hits": int((hits & exact).sum()),
                "hit_rate_new_text": float((hits & ~exact).mean()),
                metric: sp, "delta": sp - full_sp,
                "attn_speedup": float(a_full.sum() / a_cache.sum()),
                "e2e_speedup": float(t_full.sum() / t_cache.sum()),
                "attn_speedup_on_hits": float(a_full[hits].sum() / a_hit[hits].sum()) if hits.any() else None,
                "e2e_speedup_on_hits": float(t_full[hits].sum() / t_hit[hits].sum()) if hits.any() else None}

    sweep = [row(th) for th in thetas]
    # the run at the config's theta itself (real lookup decisions, its own timings)
    hits = np.array([r["lookup"]["hit"] for r in rec.values()])
    t_look = np.array([r["lookup"]["t"] for r in rec.values()])
    a_look = np.array([r["lookup"]["attn_s"] for r in rec.values()])
    direct = {"theta": theta, "hit_rate": float(hits.mean()), "hits": int(hits.sum()),
              "exact_text_hits": int((hits & exact).sum()), "hit_rate_new_text": float((hits & ~exact).mean()),
              metric: score({s: r["lookup"]["emb"] for s, r in rec.items()}),
              "attn_speedup": float(a_full.sum() / a_look.sum()), "e2e_speedup": float(t_full.sum() / t_look.sum()),
              "attn_speedup_on_hits": float(a_full[hits].sum() / a_look[hits].sum()) if hits.any() else None,
              "e2e_speedup_on_hits": float(t_full[hits].sum() / t_look[hits].sum()) if hits.any() else None}
    direct["delta"] = direct[metric] - full_sp
    has_cand = np.isfinite(sims)
    ms = {"full_e2e": 1e3 * t_full.mean(), "full_attention": 1e3 * a_full.mean(),
          "hit_e2e": 1e3 * t_hit[has_cand].mean() if has_cand.any() else None,
          "hit_attention": 1e3 * a_hit[has_cand].mean() if has_cand.any() else None,
          "lookup": 1e3 * lookup.mean()}
    return {"metric": metric, f"full_{metric}": full_sp, "test_sentences": len(rec),
            "with_equal_length_candidate": int(has_cand.sum()),
            "at_theta": direct, "sweep": sweep, "ms_per_sentence": ms,
            "sims": [float(x) if np.isfinite(x) else None for x in sims]}


def build_text_store(cache, enc: Encoder, texts: list[str], root: Path, progress: bool):
    """build_store over ``texts`` (their exact texts kept for the new-text hit rate) -> (store, seconds)."""
    t0 = time.perf_counter()
    store = build_store(cache, enc.embed, texts, root, progress=progress)
    store.manifest["texts"] = texts
    return store, time.perf_counter() - t0


def calibrated_theta(calibration: dict, thetas, max_drop: float, n: int, what: str) -> float:
    """The smallest theta of the sweep whose calibration score drop, and that of every larger theta of
    the sweep, is at most ``max_drop`` (else the largest theta): one noisy passing point below a
    failing one is not taken."""
    theta = max(thetas)
    for r in sorted(calibration["sweep"], key=lambda r: -r["theta"]):
        if r["delta"] < -max_drop:
            break
        theta = r["theta"]
    print(f"calibration ({n} {what}): theta {theta:g} = the smallest whose {calibration['metric']} drops by at "
          f"most {max_drop:g} there and at every larger theta")
    return theta


def report(result: dict, args) -> int:
    print_table(result)
    save_outputs(result, args, attncache_plots)
    return 0


def print_table(result: dict) -> None:
    metric = result.get("metric", "spearman")
    if result.get("task", "stsb") == "stsb":
        print(f"AttnCache on STS-B dev, {result['model']}: database {result['db_sentences']} sentences "
              f"({result['train_pairs']} pairs), test {result['test_pairs']} pairs / {result['test_sentences']} sentences")
    else:
        print(f"AttnCache on {result['task']}, {result['model']}: database {result['db_sentences']} sentences, "
              f"test {result['test_sentences']} sentences")
    print(f"full model {metric} {result['full_' + metric]:.2f}; ms/sentence: " +
          ", ".join(f"{k} {v:.2f}" for k, v in result["ms_per_sentence"].items() if v is not None))
    head = f"{'theta':>8} {'hit rate':>8} {'new text':>8} {metric[:9]:>9} {'delta':>7} {'attn x':>7} {'e2e x':>7} {'attn x hit':>10} " \
           f"{'e2e x hit':>9}"
    print(head)

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0].lstrip(">")))
    for r in result["sweep"] + [dict(result["at_theta"], theta=f"{result['at_theta']['theta']}*")]:
        th = r["theta"] if isinstance(r["theta"], str) else f"{r['theta']:g}"
        print(f"{th:>8} {r['hit_rate']:8.1%} {r['hit_rate_new_text']:8.1%} {r[metric]:9.2f} {r['delta']:7.2f} {r['attn_speedup']:7.2f} "
              f"{r['e2e_speedup']:7.2f} {fmt(r['attn_speedup_on_hits'], '>10.2f')} "
              f"{fmt(r['e2e_speedup_on_hits'], '>9.2f')}")
    print("new text = hit rate without the hits whose exact text is stored; "
          "* = the run at the config's theta with real lookup decisions; other rows composed from the same run's "
          "per-sentence timings (hit: AttnCache time; miss: full time + lookup time)")


def run_sst2(args, argv, cfg, thetas) -> int:
    """SST-2 dev: database = probe training set = the first ``--train`` sentences of a seeded shuffle
    (``--db-extra stsb``: plus the STS-B dev sentences, in the database only); the probe is fitted on the
    full model's embeddings; test accuracy (%) full vs AttnCache. ``--calib N``: the first N held-out
    sentences choose theta (``calibrated_theta``), the others are the test set, run at that theta."""
    import numpy as np
    import torch
    path = args.data or data_file(SST2)
    rows = load_sst2(path)
    n_train = len(rows) // 2 if args.train is None else args.train
    if not 2 <= n_train < len(rows) - 1:
        raise ConfigError(f"--train must be in 2..{len(rows) - 2} (SST-2 sentences), got {n_train}")
    order = np.random.default_rng(cfg.seed).permutation(len(rows))
    train = [rows[i] for i in order[:n_train]]
    test = [rows[i] for i in order[n_train:]]
    calib, test = calib_test_split(test, args, "SST-2 sentences")
    if args.db_extra not in (None, "stsb"):
        raise ConfigError(f"--db-extra must be stsb, got '{args.db_extra}'")
    extra = [] if args.db_extra is None else list(dict.fromkeys(
        s for _, a, b in load_stsb(data_file(STSB)) for s in (a, b)))
    check_outputs(args.out, args.plot)
    print(f"data: {describe_data_file(path, SST2, 'SST-2 dev')}" +
          ("" if args.db_extra is None else f"; database also {describe_data_file(data_file(STSB), STSB, 'STS-B dev')}"))
    enc, load_s = load_encoder(args)
    db = list(dict.fromkeys([s for s, _ in train] + extra))
    train_emb = [enc.embed(s).clone() for s, _ in train]
    predict = fit_probe(train_emb, [y for _, y in train])

    def scorer(split):
        labels = {s: y for s, y in split}
        sentences = list(labels)

        def accuracy(emb):
            pred = predict([emb[s] for s in sentences])
            return 100.0 * float((pred == torch.as_tensor([labels[s] for s in sentences])).double().mean())
        return sentences, accuracy
    cache = AttnCache(enc.base, cfg)
    theta, calibration = cfg.theta, None
    with store_root(args.store, cache) as root:
        store, build_s = build_text_store(cache, enc, db, root, args.progress)
        if calib:
            sentences, accuracy = scorer(calib)
            calibration = evaluate(enc, cache, store, None, cfg.theta, thetas, progress=args.progress,
                                   sentences=sentences, score=accuracy, metric="accuracy")
            theta = calibrated_theta(calibration, thetas, args.calib_drop, len(calib), "sentences")
        sentences, accuracy = scorer(test)
        res = evaluate(enc, cache, store, None, theta, thetas, progress=args.progress, sentences=sentences,
                       score=accuracy, metric="accuracy")
    result = {"model": args.model, "task": "sst2", "command": "ladmac eval attncache " + " ".join(argv),
              "config": cfg.to_dict(), "threads": args.threads, "train_sentences": len(train),
              "db_sentences": len(db), "db_extra": args.db_extra, "calib_sentences": len(calib),
              "theta_used": theta, "calibration": calibration, "load_s": load_s, "build_s": build_s, **res}
    return report(result, args)


def stsb_splits(args, cfg):
    """The run's STS-B dev pairs (printed: the file read), checked before a model loads:
    (database pairs, calibration pairs, test pairs)."""
    path = args.data or data_file(STSB)
    rows = load_stsb(path)
    train, test = split_pairs(rows, 1000 if args.train is None else args.train, None, cfg.seed)
    calib, test = calib_test_split(test, args, "STS-B pairs")
    check_outputs(args.out, args.plot)
    print(f"data: {describe_data_file(path, STSB, 'STS-B dev')}")
    return train, calib, test


def load_encoder(args) -> tuple[Encoder, float]:
    """The run's model with ``--threads`` torch threads, and the seconds its loading took."""
    import torch
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    enc = Encoder(args.model)
    return enc, time.perf_counter() - t0


def run_stsb(args, argv, cfg, thetas) -> int:
    """STS-B dev: the sentences of the first ``--train`` pairs of a seeded shuffle form the database;
    ``--calib N``: the next N pairs choose theta (``calibrated_theta``); the remaining pairs are the
    test set: Spearman full vs AttnCache, hit rates and speedups over the theta sweep."""
    train, calib, test = stsb_splits(args, cfg)
    enc, load_s = load_encoder(args)
    cache = AttnCache(enc.base, cfg)
    db_sentences = list(dict.fromkeys(s for _, a, b in train for s in (a, b)))
    with store_root(args.store, cache) as root:
        store, build_s = build_text_store(cache, enc, db_sentences, root, args.progress)
        theta, calibration = cfg.theta, None
        if calib:
            calibration = evaluate(enc, cache, store, calib, cfg.theta, thetas, progress=args.progress)
            theta = calibrated_theta(calibration, thetas, args.calib_drop, len(calib), "pairs")
        res = evaluate(enc, cache, store, test, theta, thetas, progress=args.progress)
    result = {"model": args.model, "command": "ladmac eval attncache " + " ".join(argv),
              "config": cfg.to_dict(), "threads": args.threads, "train_pairs": len(train),
              "calib_pairs": len(calib), "theta_used": theta, "calibration": calibration,
              "test_pairs": len(test), "db_sentences": len(db_sentences), "load_s": load_s, "build_s": build_s,
              "train_loss_first_last": [store.manifest["train_loss"][0], store.manifest["train_loss"][-1]]
              if store.manifest["train_loss"] else None, **res}
    return report(result, args)
