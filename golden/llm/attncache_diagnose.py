"""``ladmac eval attncache --diagnose``: which layers tolerate reuse (docs/results_attncache.md
section 1): per test sentence the oracle and a random equal-length stored candidate, reused in the
layers of each set."""
from __future__ import annotations

from ..attncache import AttnCache, record_inputs
from .attncache_sentences import Encoder, load_encoder, spearman_x100, stsb_splits
from .report import write_json

class FixedStore:
    """Duck-typed MapStore for the diagnosis: row b's candidate is ``choice[current[b]]`` (the batch's
    sentences), read from a recording, similarity 1 (no projector, no file)."""

    def __init__(self, rec, choice: dict, layers: list[int], cfg):
        self.rec, self.choice, self.layers, self.cfg, self.current = rec, choice, layers, cfg, None
        self.heads = rec.maps[0][0].reshape(-1, rec.lengths[0], rec.lengths[0]).shape[0]

    def features(self, pooled):
        import numpy as np
        return np.zeros((pooled.shape[0], 1), np.float32)

    def search_batch(self, features, lengths):
        import numpy as np
        entries = np.array([self.choice.get(s, -1) for s in self.current])
        return entries, np.where(entries >= 0, 1.0, -np.inf)

    def fetch(self, entry):
        n = self.rec.lengths[entry]
        return {layer: self.rec.maps[entry][layer].reshape(1, -1, n, n).float() for layer in self.layers}


def layer_distances(maps_a, maps_b):
    """Per-layer map distance (mean over heads and rows of 0.5 * row L2), equal lengths."""
    import torch
    return [float((0.5 * torch.linalg.vector_norm(a.float() - b.float(), dim=-1)).mean())
            for a, b in zip(maps_a, maps_b)]


def diagnose(enc: Encoder, cache, db_sentences, test_pairs, layer_sets, cfg, progress: bool = True,
             batch: int = 16, partial=None) -> dict:
    """Which reuse is harmless: per test sentence the ORACLE candidate (equal-length stored input with
    the smallest true map distance over all layers) and a RANDOM equal-length one; Spearman change and
    mean cosine (AttnCache vs full embedding) when every test sentence reuses the candidate's maps in
    the layers of each set; mean per-layer map distance oracle / random / median candidate; and how
    well each layer's map distance predicts the embedding change (Spearman rank correlation over the
    test sentences, reusing that layer only from the random candidate). Sentences run in batches of
    ``batch`` (sorted by length); ``partial(result)`` is called after each layer set."""
    import numpy as np
    import torch
    from scipy.stats import spearmanr
    from tqdm import tqdm
    sentences = list(dict.fromkeys(s for _, a, b in test_pairs for s in (a, b)))
    rdb = record_inputs(cache, enc.embed, db_sentences, progress)
    rts = record_inputs(cache, enc.embed, sentences, progress)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(rdb.lengths):
        by_len.setdefault(n, []).append(i)
    rng = np.random.default_rng(cfg.seed)
    oracle, rand, d_or, d_rand, d_med = {}, {}, {}, {}, []
    for t, s in enumerate(tqdm(sentences, desc="map distances", disable=not progress, leave=False)):
        cands = by_len.get(rts.lengths[t], [])
        if not cands:
            continue
        dist = np.array([layer_distances(rts.maps[t], rdb.maps[j]) for j in cands])  # (cands, layers)
        best, pick = int(dist.mean(1).argmin()), int(rng.integers(len(cands)))
        oracle[s], rand[s] = cands[best], cands[pick]
        d_or[s], d_rand[s] = dist[best], dist[pick]
        d_med.append(np.median(dist, 0))
    by_length = sorted(sentences, key=lambda s: len(enc.tok(enc.text(s))["input_ids"]))
    chunks = [by_length[i:i + batch] for i in range(0, len(by_length), batch)]

    def embed_all(store=None):
        emb = {}
        for chunk in chunks:
            if store is not None:
                store.current = chunk
            emb.update(zip(chunk, enc.embed_batch(chunk)))
        return emb

    full = embed_all()
    full_sp = spearman_x100(full, test_pairs)

    def run(choice, layers):
        store = FixedStore(rdb, choice, layers, cfg)
        cache.store, cache.theta, cache.mode = store, 0.0, "force"
        try:
            emb = embed_all(store)
        finally:
            cache.mode, cache.store = "off", None
        cos = {s: float(torch.cosine_similarity(emb[s], full[s], dim=0)) for s in choice}
        return spearman_x100(emb, test_pairs) - full_sp, cos

    rows = []
    summary = {"full_spearman": full_sp, "test_sentences": len(sentences), "with_candidate": len(oracle),
               "db_sentences": len(db_sentences),
               "layer_distance": {"oracle": np.mean(list(d_or.values()), 0).tolist(),
                                  "random": np.mean(list(d_rand.values()), 0).tolist(),
                                  "median": np.median(d_med, 0).tolist()},
               "reuse": rows}
    for layers in tqdm(layer_sets, desc="reuse sets", disable=not progress, leave=False):
        row = {"layers": layers}
        for name, choice in (("oracle", oracle), ("random", rand)):
            delta, cos = run(choice, layers)
            row[f"{name}_delta"] = delta
            row[f"{name}_cos"] = float(np.mean(list(cos.values())))
            if name == "random" and len(layers) == 1:
                keys = list(cos)
                row["rank_corr_dist_vs_change"] = float(spearmanr(
                    [d_rand[s][layers[0]] for s in keys], [1.0 - cos[s] for s in keys]).statistic)
        rows.append(row)
        print(f"  layers {','.join(map(str, layers))}: oracle {row['oracle_delta']:+.2f} (cos {row['oracle_cos']:.4f})"
              f", random {row['random_delta']:+.2f} (cos {row['random_cos']:.4f})"
              + (f", rank corr(d, 1-cos) {row['rank_corr_dist_vs_change']:.2f}"
                 if "rank_corr_dist_vs_change" in row else ""), flush=True)
        if partial is not None:
            partial(summary)
    return summary


def run_diagnosis(args, argv, cfg, sets: list[list[int]]) -> int:
    """``--diagnose``: :func:`diagnose` on the STS-B database and test pairs of the run."""
    train, _, test = stsb_splits(args, cfg)
    enc, _ = load_encoder(args)
    cache = AttnCache(enc.base, cfg)
    db_sentences = list(dict.fromkeys(s for _, a, b in train for s in (a, b)))
    try:
        head = {"model": args.model, "command": "ladmac eval attncache " + " ".join(argv),
                "config": cfg.to_dict(), "train_pairs": len(train), "test_pairs": len(test)}
        res = diagnose(enc, cache, db_sentences, test, sets, cfg, progress=args.progress,
                       partial=(lambda r: write_json(args.out, {**head, **r, "partial": True})) if args.out else None)
    finally:
        cache.detach()
    result = {**head, **res}
    print(f"full Spearman {res['full_spearman']:.2f}; per-layer map distance oracle / random / median: " +
          "; ".join(f"{a:.3f}/{b:.3f}/{c:.3f}" for a, b, c in zip(*res["layer_distance"].values())))
    if args.out:
        write_json(args.out, result)
    return 0
