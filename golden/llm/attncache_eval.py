"""``ladmac eval attncache``: AttnCache (docs/algorithms.md section 3) in a real model: STS-B, SST-2, MMLU.

The command's entry: its options, the config each model starts from (``--set NAME=VALUE`` edits
it: theta, epochs, pairs, index, seed, ...), every check of the options before a model loads, and
the task it runs: STS-B dev (``--task stsb``, the default) and SST-2 dev (``--task sst2``) in
:mod:`.attncache_sentences`, MMLU in :mod:`.attncache_mmlu`, the per-layer diagnosis
(``--diagnose``) in :mod:`.attncache_diagnose`; the data loaders are in :mod:`.attncache_data`.
Results: docs/results_attncache.md."""
from __future__ import annotations

import dataclasses
import os

from ..attncache import AttnCacheConfig, parse_layers
from ..cli import Parser, add_overrides, configure
from ..errors import ConfigError
from .attncache_data import SST2, STSB

DEFAULT_THETAS = (1.0, 0.9999, 0.999, 0.995, 0.99, 0.98, 0.95, 0.9, 0.8, 0.0)
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
# MMLU --reuse similar: SmolLM2's projector route with every layer reused on a hit, theta calibrated; an
# exact scan of the few hundred stored questions, deep enough (k) that an equal-length one is found
MMLU_SIMILAR_CONFIG = dataclasses.replace(MODEL_CONFIGS["smollm2"], layers="all", index="flat", k=512)
NUM_LAYERS = {"minilm": 6, "smollm2": 30}  # checked against the loaded model by AttnCache


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
    p.add_argument("--reuse", default="prefix", help="mmlu: what the store holds: prefix (default: each subject's "
                                                    "shared prompt prefix, its rows exact), repeat (the scored "
                                                    "prompts themselves: every hit reuses all rows of all layers, "
                                                    "the fastest a hit can be) or similar (other test questions: "
                                                    "a scored question reuses the maps of a different one; "
                                                    "0-shot)")
    add_overrides(p, "an AttnCacheConfig parameter (theta, epochs, pairs, index, seed, ...; "
                     "base: the model's entry of MODEL_CONFIGS)")
    p.add_argument("--thetas", default=",".join(f"{t:g}" for t in DEFAULT_THETAS), help="comma list for the sweep")
    p.add_argument("--train", type=int, default=None, help="STS-B dev pairs whose sentences form the database "
                                                           "(default 1000); sst2: sentences of the database and "
                                                           "the probe's training set (default 436, half)")
    p.add_argument("--test", type=int, default=None, help="test pairs (default: all the rest)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    p.add_argument("--data", default=None, help=f"the task's data file (default data/{STSB}; sst2: data/{SST2})")
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
        from .attncache_mmlu import run_mmlu
        base = MMLU_SIMILAR_CONFIG if args.reuse == "similar" else MMLU_CONFIG
        return run_mmlu(args, argv, configure(base, args.set), thetas)
    if args.task == "sst2":
        if args.diagnose is not None:
            raise ConfigError("--diagnose runs on stsb only")
        from .attncache_sentences import run_sst2
        return run_sst2(args, argv, cfg, thetas)
    if sets:
        from .attncache_diagnose import run_diagnosis
        return run_diagnosis(args, argv, cfg, sets)
    from .attncache_sentences import run_stsb
    return run_stsb(args, argv, cfg, thetas)
