"""``ladmac eval attncache``: AttnCache (docs/algorithms.md section 3) on STS-B dev with a real model.

Builds the map store from the first ``--train`` pairs of a seeded shuffle of STS-B dev, then on
the remaining pairs computes Spearman (x100) of cosine similarity vs gold for the full model and
for AttnCache, the hit rate, and attention / end-to-end speedups timed side by side in this run
(per test sentence: full model, AttnCache at the config's ``theta``, and a forced reuse of the
nearest equal-length candidate, which gives every other theta of the sweep exactly: the
candidate does not depend on theta). ``--set NAME=VALUE`` edits the AttnCacheConfig (theta,
epochs, pairs, index, seed, ...), which starts from the model's entry of ``MODEL_CONFIGS``. Embeddings: MiniLM mean pooling; SmolLM2 prompt-based
(``This sentence: "..." means in one word:"``, last token's final hidden state)."""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..attncache import AttnCacheConfig
from ..cli import Parser, add_overrides, configure
from ..errors import ConfigError, DataError
from ..paths import data_file
from .data import read_data_text
from .plots import attncache_plots
from .report import check_outputs, write_json

DEFAULT_THETAS = (1.0, 0.9999, 0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.0)
PROMPT = 'This sentence: "{}" means in one word:"'
STSB = "stsb/sts-dev.csv"
# The config each model starts from (``--set`` edits it): AttnCacheConfig's defaults for MiniLM;
# SmolLM2's prompt-wrapped sentences are longer, so its layer-0 input is pooled from more rows.
# Both reuse a subset of layers with the map-distance label and theta on the predicted distance
# (docs/results_attncache.md: the diagnosis that chose them; ``--set layers=all --set label=paper
# --set similarity=sqdist --set theta=0.99`` is the papers' AttnCache).
MODEL_CONFIGS = {"minilm": AttnCacheConfig(layers="0-4", label="map", similarity="dist", theta=0.89),
                 "smollm2": AttnCacheConfig(max_len=96, pool_rows=48, layers="14-16,18-20,25,27,29", label="map",
                                            similarity="dist", theta=0.85)}
MODELS = tuple(MODEL_CONFIGS)
# MMLU: the store's entries are the shared prompt prefixes; their rows are exact in every layer
MMLU_CONFIG = AttnCacheConfig(layers="all", label="map", similarity="dist", theta=1.0)
NUM_LAYERS = {"minilm": 6, "smollm2": 30}  # checked against the loaded model by AttnCache


def _calib_test_split(held_out: list, args, what: str) -> tuple[list, list]:
    """(calibration, test): the first ``--calib`` held-out items choose theta, the test items
    follow them (the first ``--test`` of the rest, when given)."""
    calib, test = [], held_out
    if args.calib is not None:
        if not 2 <= args.calib <= len(held_out) - 2:
            raise ConfigError(f"--calib must be in 2..{len(held_out) - 2} (held-out {what}), got {args.calib}")
        calib, test = held_out[:args.calib], held_out[args.calib:]
    if args.test is not None:
        if args.test < 2:
            raise ConfigError(f"--test must be >= 2, got {args.test}")
        test = test[:args.test]
    return calib, test


# ----------------------------------------------------------------------------- data
def load_stsb(path) -> list[tuple[float, str, str]]:
    """STS-B rows ``genre file year id score s1 s2 [extra]``, split on tabs only -> (score, s1, s2)."""
    path = Path(path)
    text = read_data_text(path, "STS-B")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise DataError(f"{path}:{number}: expected at least 7 tab-separated fields, got {len(fields)}")
        try:
            score = float(fields[4])
        except ValueError:
            raise DataError(f"{path}:{number}: score '{fields[4]}' is not a number") from None
        if not (0.0 <= score <= 5.0) or math.isnan(score):
            raise DataError(f"{path}:{number}: score {score} outside 0..5")
        s1, s2 = fields[5].strip(), fields[6].strip()
        if not s1 or not s2:
            raise DataError(f"{path}:{number}: empty sentence")
        rows.append((score, s1, s2))
    if len(rows) < 4:
        raise DataError(f"STS-B file {path} holds {len(rows)} rows; need at least 4")
    return rows


def split_pairs(rows, n_train: int, n_test: int | None, seed: int):
    import numpy as np
    if not 1 <= n_train < len(rows):
        raise ConfigError(f"--train must be in 1..{len(rows) - 1} (STS-B pairs), got {n_train}")
    order = np.random.default_rng(seed).permutation(len(rows))
    train = [rows[i] for i in order[:n_train]]
    test = [rows[i] for i in order[n_train:]]
    if n_test is not None:
        if n_test < 2:
            raise ConfigError(f"--test must be >= 2, got {n_test}")
        test = test[:n_test]
    return train, test


SST2 = "sst2/dev.tsv"


def load_sst2(path) -> list[tuple[str, int]]:
    """GLUE SST-2 ``sentence<TAB>label`` with a header line -> (sentence, 0/1)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"SST-2 file {path} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read SST-2 file {path}: {err}") from None
    if not lines or lines[0].split("\t")[:2] != ["sentence", "label"]:
        raise DataError(f"{path}:1: expected the header 'sentence<TAB>label'")
    rows = []
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or fields[1].strip() not in ("0", "1") or not fields[0].strip():
            raise DataError(f"{path}:{number}: expected 'sentence<TAB>0|1'")
        rows.append((fields[0].strip(), int(fields[1])))
    if len(rows) < 4:
        raise DataError(f"SST-2 file {path} holds {len(rows)} rows; need at least 4")
    return rows


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


# ----------------------------------------------------------------------------- models
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


# ----------------------------------------------------------------------------- evaluation
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


class _FixedStore:
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
    from ..attncache import record_inputs
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
        store = _FixedStore(rdb, choice, layers, cfg)
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


def build_parser() -> Parser:
    p = Parser(prog="ladmac eval attncache", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", default="minilm", help="minilm (default) or smollm2")
    p.add_argument("--task", default="stsb", help="stsb (default: STS-B dev Spearman), sst2 (SST-2 dev, "
                                                  "logistic-regression probe on the embeddings, accuracy) or mmlu "
                                                  "(data/mmlu test, SmolLM2, answer-letter logits)")
    p.add_argument("--shots", type=int, default=5, help="mmlu: dev exemplars in the prompt, 0..5 (default 5)")
    p.add_argument("--limit", type=int, default=None, help="mmlu: questions per subject (seeded shuffle; "
                                                           "default all)")
    p.add_argument("--calib", type=int, default=None, help="held-out STS-B pairs / SST-2 sentences that choose "
                                                           "theta (the test set follows them)")
    p.add_argument("--calib-drop", type=float, default=0.5, help="--calib: largest calibration score drop "
                                                                 "(points) theta may cost (default 0.5)")
    p.add_argument("--db-extra", default=None, help="sst2: 'stsb' adds the STS-B dev sentences to the database")
    p.add_argument("--subjects", default=None, help="mmlu: comma list of subjects (default: all in data/mmlu)")
    add_overrides(p, "an AttnCacheConfig parameter (theta, epochs, pairs, index, seed, ...; "
                     "base: the model's entry of MODEL_CONFIGS)")
    p.add_argument("--thetas", default=",".join(f"{t:g}" for t in DEFAULT_THETAS), help="comma list for the sweep")
    p.add_argument("--train", type=int, default=None, help="STS-B dev pairs whose sentences form the database "
                                                           "(default 1000); sst2: sentences of the database and "
                                                           "the probe's training set (default 436, half)")
    p.add_argument("--test", type=int, default=None, help="test pairs (default: all the rest)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    p.add_argument("--data", default=None, help=f"STS-B dev file (default data/{STSB})")
    p.add_argument("--store", default=None, help="keep the map store here (default: a temp folder, removed)")
    p.add_argument("--out", default=None, help="write results JSON here")
    p.add_argument("--plot", default=None, help="write PNG plots (Spearman, hit rate vs theta) into this folder")
    p.add_argument("--diagnose", default=None, metavar="SETS",
                   help="instead of the evaluation: reuse from the oracle / a random equal-length candidate in "
                        "each layer set (';'-separated, e.g. 'each;all;0-4'; 'each' = every layer alone)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def eval_config(model: str, pairs: list[str] | None = None):
    """The run's AttnCacheConfig: the model's base config with the ``--set`` pairs applied."""
    if model not in MODEL_CONFIGS:
        raise ConfigError(f"unknown model '{model}' (known: {', '.join(MODELS)})")
    return configure(MODEL_CONFIGS[model], pairs)


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    if args.task == "mmlu" and not any(a == "--model" or a.startswith("--model=") for a in argv):
        args.model = "smollm2"  # the MMLU mode's model
    cfg = eval_config(args.model, args.set)
    try:
        thetas = [float(t) for t in args.thetas.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--thetas expects numbers separated by commas, got '{args.thetas}'") from None
    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    from ..attncache import parse_layers
    cfg.reuse_layers(NUM_LAYERS[args.model])  # ConfigError before the model loads
    sets = []
    if args.diagnose is not None:
        try:
            for part in args.diagnose.split(";"):
                if part.strip() == "each":
                    sets += [[n] for n in range(NUM_LAYERS[args.model])]
                elif part.strip():
                    sets.append(parse_layers(part, NUM_LAYERS[args.model]))
        except ValueError as err:
            raise ConfigError(f"--diagnose: {err}") from None
        if not sets:
            raise ConfigError("--diagnose: no layer set given")
    if args.task not in ("stsb", "sst2", "mmlu"):
        raise ConfigError(f"unknown task '{args.task}' (known: stsb, sst2, mmlu)")
    if args.task == "mmlu":
        if args.diagnose is not None:
            raise ConfigError("--diagnose runs on stsb only")
        return main_mmlu(args, argv, configure(MMLU_CONFIG, args.set))
    if args.task == "sst2":
        if args.diagnose is not None:
            raise ConfigError("--diagnose runs on stsb only")
        return main_sst2(args, argv, cfg, thetas)
    rows = load_stsb(args.data or data_file(STSB))
    train, test = split_pairs(rows, 1000 if args.train is None else args.train, None, cfg.seed)
    calib, test = _calib_test_split(test, args, "STS-B pairs")
    check_outputs(args.out, args.plot)

    import torch
    from ..attncache import AttnCache
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    enc = Encoder(args.model)
    load_s = time.perf_counter() - t0
    cache = AttnCache(enc.base, cfg)
    db_sentences = list(dict.fromkeys(s for _, a, b in train for s in (a, b)))
    if args.diagnose is not None:
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
    with _store_root(args.store, cache) as root:
        store, build_s = _build_text_store(cache, enc, db_sentences, root, args.progress)
        theta, calibration = cfg.theta, None
        if calib:
            calibration = evaluate(enc, cache, store, calib, cfg.theta, thetas, progress=args.progress)
            theta = _calibrated_theta(calibration, thetas, args.calib_drop, len(calib), "pairs")
        res = evaluate(enc, cache, store, test, theta, thetas, progress=args.progress)
    result = {"model": args.model, "command": "ladmac eval attncache " + " ".join(argv),
              "config": cfg.to_dict(), "threads": args.threads, "train_pairs": len(train),
              "calib_pairs": len(calib), "theta_used": theta, "calibration": calibration,
              "test_pairs": len(test), "db_sentences": len(db_sentences), "load_s": load_s, "build_s": build_s,
              "train_loss_first_last": [store.manifest["train_loss"][0], store.manifest["train_loss"][-1]]
              if store.manifest["train_loss"] else None, **res}
    return _report(result, args)


@contextlib.contextmanager
def _store_root(store: str | None, cache):
    """The store's folder (``--store``, or a temp folder removed afterwards); detaches ``cache`` on exit."""
    tmp = None
    root = Path(store) if store else Path(tmp := tempfile.mkdtemp(prefix="ladmac-attncache-"))
    try:
        yield root
    finally:
        cache.detach()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _build_text_store(cache, enc: Encoder, texts: list[str], root: Path, progress: bool):
    """build_store over ``texts`` (their exact texts kept for the new-text hit rate) -> (store, seconds)."""
    from ..attncache import build_store
    t0 = time.perf_counter()
    store = build_store(cache, enc.embed, texts, root, progress=progress)
    store.manifest["texts"] = texts
    return store, time.perf_counter() - t0


def _calibrated_theta(calibration: dict, thetas, max_drop: float, n: int, what: str) -> float:
    """The smallest theta of the sweep whose calibration score drop, and that of every larger theta of
    the sweep, is at most ``max_drop`` (else the largest theta): one noisy passing point below a
    failing one is not taken."""
    theta = max(thetas)
    for r in sorted(calibration["sweep"], key=lambda r: -r["theta"]):
        if r["delta"] < -max_drop:
            break
        theta = r["theta"]
    print(f"calibration ({n} {what}): theta {theta:g} = the smallest with a {calibration['metric']} drop <= "
          f"{max_drop:g} there and at every larger theta")
    return theta


def _report(result: dict, args) -> int:
    print_table(result)
    if args.plot:
        result["plots"] = attncache_plots(result, args.plot)
        print("plots: " + ", ".join(result["plots"]))
    if args.out:
        write_json(args.out, result)
    return 0


def main_sst2(args, argv, cfg, thetas) -> int:
    """SST-2 dev: database = probe training set = the first ``--train`` sentences of a seeded shuffle
    (``--db-extra stsb``: plus the STS-B dev sentences, in the database only); the probe is fitted on the
    full model's embeddings; test accuracy (%) full vs AttnCache. ``--calib N``: the first N held-out
    sentences choose theta (``_calibrated_theta``), the others are the test set, run at that theta."""
    import numpy as np
    import torch
    from ..attncache import AttnCache
    rows = load_sst2(args.data or data_file(SST2))
    n_train = len(rows) // 2 if args.train is None else args.train
    if not 2 <= n_train < len(rows) - 1:
        raise ConfigError(f"--train must be in 2..{len(rows) - 2} (SST-2 sentences), got {n_train}")
    order = np.random.default_rng(cfg.seed).permutation(len(rows))
    train = [rows[i] for i in order[:n_train]]
    test = [rows[i] for i in order[n_train:]]
    calib, test = _calib_test_split(test, args, "SST-2 sentences")
    if args.db_extra not in (None, "stsb"):
        raise ConfigError(f"--db-extra must be stsb, got '{args.db_extra}'")
    extra = [] if args.db_extra is None else list(dict.fromkeys(
        s for _, a, b in load_stsb(data_file(STSB)) for s in (a, b)))
    check_outputs(args.out, args.plot)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    enc = Encoder(args.model)
    load_s = time.perf_counter() - t0
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
    with _store_root(args.store, cache) as root:
        store, build_s = _build_text_store(cache, enc, db, root, args.progress)
        if calib:
            sentences, accuracy = scorer(calib)
            calibration = evaluate(enc, cache, store, None, cfg.theta, thetas, progress=args.progress,
                                   sentences=sentences, score=accuracy, metric="accuracy")
            theta = _calibrated_theta(calibration, thetas, args.calib_drop, len(calib), "sentences")
        sentences, accuracy = scorer(test)
        res = evaluate(enc, cache, store, None, theta, thetas, progress=args.progress, sentences=sentences,
                       score=accuracy, metric="accuracy")
    result = {"model": args.model, "task": "sst2", "command": "ladmac eval attncache " + " ".join(argv),
              "config": cfg.to_dict(), "threads": args.threads, "train_sentences": len(train),
              "db_sentences": len(db), "db_extra": args.db_extra, "calib_sentences": len(calib),
              "theta_used": theta, "calibration": calibration, "load_s": load_s, "build_s": build_s, **res}
    return _report(result, args)


# ----------------------------------------------------------------------------- MMLU
def mmlu_questions(tok, shots: int, subjects: list[str], limit: int | None, seed: int):
    """Per subject: (prefix text, prefix ids, [(question ids, answer letter)]); ``limit`` questions per
    subject from a seeded shuffle (all when None). Input ids = prefix ids + question ids (tokenized
    apart, so every question of a subject starts with exactly the same ids)."""
    import numpy as np
    import torch
    from .data import mmlu_prompts
    out = []
    for subject in subjects:
        prefix, items = mmlu_prompts(subject, shots)
        if limit is not None:
            order = np.random.default_rng(seed).permutation(len(items))[:limit]
            items = [items[i] for i in sorted(order)]
        pids = torch.tensor(tok(prefix).input_ids, dtype=torch.long)
        out.append((subject, prefix, pids, [(torch.tensor(tok(q).input_ids, dtype=torch.long), a) for q, a in items]))
    return out


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
    return out


def main_mmlu(args, argv, cfg) -> int:
    """MMLU 0/5-shot with SmolLM2: per subject a prefix store (the header and the ``--shots`` dev
    exemplars every question of the subject starts with; its map serves the prompt's first P rows
    exactly), then per test question the full model and AttnCache side by side (order alternating),
    choice = argmax of the answer-letter logits at the last position; accuracy, hit rate, attention and
    end-to-end times (all inputs, then hits only) and the time breakdown."""
    import numpy as np
    import torch
    from tqdm import tqdm
    from ..attncache import AttnCache, build_prefix_store
    from .data import MMLU_CHOICES, mmlu_subjects
    if args.model != "smollm2":
        raise ConfigError("--task mmlu runs with --model smollm2 (a causal LM with answer-letter logits)")
    if args.shots not in (0, 1, 2, 3, 4, 5):
        raise ConfigError(f"--shots must be 0..5 (the dev file holds 5 exemplars), got {args.shots}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    known = mmlu_subjects()
    subjects = known if not args.subjects else [s.strip() for s in args.subjects.split(",") if s.strip()]
    bad = [s for s in subjects if s not in known]
    if bad or not subjects:
        raise ConfigError(f"unknown MMLU subject(s) {', '.join(bad) or '(none given)'} (known: {', '.join(known)})")
    check_outputs(args.out, args.plot)
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
    data = mmlu_questions(tok, args.shots, subjects, args.limit, cfg.seed)

    def run_ids(ids):
        with torch.inference_mode():
            return base(input_ids=ids.view(1, -1)).last_hidden_state

    def answer(ids):
        with torch.inference_mode():
            hidden = base(input_ids=ids.view(1, -1)).last_hidden_state[:, -1]
            return head(hidden)[0, letters]

    cache = AttnCache(base, cfg)
    result = {"model": args.model, "task": "mmlu", "shots": args.shots, "command": "ladmac eval attncache " +
              " ".join(argv), "config": cfg.to_dict(), "threads": args.threads, "limit_per_subject": args.limit,
              "load_s": load_s}
    rows, per_subject = [], []
    with _store_root(args.store, cache) as root:
        t0 = time.perf_counter()
        store = build_prefix_store(cache, run_ids, [d[2] for d in data], root, progress=args.progress,
                                   texts=[d[1] for d in data])
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
          f"{result['e2e_speedup_on_hits'] or 0:.2f}x")
    for key in ("full", "attncache"):
        print(f"ms per question, {key}: " + ", ".join(f"{k} {v:.1f}" for k, v in result["ms_per_question"][key].items()))
    if args.plot:
        result["plots"] = mmlu_plots(result, args.plot)
        print("plots: " + ", ".join(result["plots"]))
    if args.out:
        write_json(args.out, result)
    return 0
