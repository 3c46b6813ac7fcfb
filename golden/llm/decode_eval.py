"""``ladmac eval lad|mac``: LAD and MAC inside SmolLM2-135M during decoding (docs/algorithms.md §1, §2).

Evaluations: teacher-forced token-by-token perplexity on WikiText-2 test (or the text file
``--data`` names; the table and the JSON name the file read) vs full attention on the same
tokens, greedy-generation agreement with full attention (ROUGE-L F1 on token ids, exact token
agreement), and per-run stats of each method.

``--set NAME=VALUE`` edits the method's config: ``LadConfig`` for ``eval lad``, ``MacConfig`` for
``eval mac``; with ``--hardware`` it edits the LAD tile's ``LadTileConfig`` instead, whose float twin
is ``LadTileConfig.reference()``. ``--hardware`` runs the tile's bit-accurate model
(golden/lad_tile.py, bit-exact with the RTL) for every query head of every layer. For ``eval mac``,
``--hardware`` runs the MAC decode engine's bit-accurate model (golden/mac_decode.py, variant
``mac-decode``) next to the float reference; ``--set`` then edits its ``MacDecodeConfig`` and the
float ``mac`` variant is ``MacDecodeConfig.reference()``.

The pieces: golden/llm/hooks.py (the attention function on a controller, per-layer states),
runs.py (the decoding loops), metrics.py, data.py (WikiText-2), plots.py, report.py.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..cli import AtLeast, Parser, add_overrides, configure, parse_overrides
from ..errors import ConfigError
from ..lad_ref import LadConfig
from ..lad_tile import LadTileConfig
from ..mac_decode import MacDecodeConfig
from ..mac_ref import MacConfig, layer_set
from .activity import activity
from .data import describe_text, read_wikitext, wikitext_ids
from .hooks import Controller
from .metrics import generation_scores, perplexity
from .plots import decode_plots
from .report import check_outputs, write_json
from .runs import MODELS, full_parallel, greedy_pair, load_model, max_positions, teacher_forced

DEFAULTS = {"lad": dict(tokens=128, context=0, prompts=2, new_tokens=32, prompt_len=64),
            "mac": dict(tokens=64, context=2048, prompts=1, new_tokens=32, prompt_len=2048)}
BASE_CONFIGS = {"lad": LadConfig(), "mac": MacConfig()}
HARDWARE = ("lad-tile", "mac-decode")   # the variants that run an engine's bit-accurate model
MODEL_FIELDS = ("head_dim", "scale")  # LadConfig fields the model fixes (set per layer from the model)
MODEL_HEAD_DIM = 64                   # SmolLM2's head dimension (the tile's head_dim must match)
MODEL_LAYERS = 30                     # SmolLM2's layers (full_layers must name some of them)


def build_parser(method: str) -> Parser:
    d = DEFAULTS[method]
    p = Parser(prog=f"ladmac eval {method}", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", default="smollm2", help="model (only smollm2)")
    p.add_argument("--tokens", action=AtLeast, default=d["tokens"], help="teacher-forced tokens scored")
    p.add_argument("--context", action=AtLeast, minimum=0, default=d["context"],
                   help="tokens prefilled with full attention before the scored ones")
    p.add_argument("--offset", action=AtLeast, minimum=0, default=0,
                   help="token of the text the teacher-forced sequence starts at (runs at several offsets "
                        "measure the spread)")
    p.add_argument("--prompts", action=AtLeast, minimum=0, default=d["prompts"], help="greedy-generation prompts")
    p.add_argument("--new-tokens", action=AtLeast, default=d["new_tokens"], help="tokens generated per prompt")
    p.add_argument("--prompt-len", action=AtLeast, default=d["prompt_len"], help="prompt length in tokens")
    if method == "lad":
        add_overrides(p, "a LadConfig parameter (with --hardware: a LadTileConfig parameter)")
        p.add_argument("--hardware", action="store_true",
                       help="also run the LAD tile's bit-accurate model (golden/lad_tile.py, bit-exact with the "
                            "RTL) for every head, and its float twin (lad-tile-float)")
    else:
        add_overrides(p, "a MacConfig parameter (with --hardware: a MacDecodeConfig parameter)")
        p.add_argument("--hardware", action="store_true",
                       help="also run the MAC decode engine's bit-accurate model (golden/mac_decode.py) for every "
                            "head of every layer (variant mac-decode); mac is then its float reference")
    p.add_argument("--ablate", action="store_true",
                   help="also run the ablation variant (LAD: exact scores = PWL error only; "
                        "MAC: exact prefix = merge machinery only)")
    p.add_argument("--variants", default=None, metavar="A,B",
                   help="run only these of the run's variants (default all: the method, its --ablate variant, "
                        "and with --hardware lad-tile-float and lad-tile); full attention always runs")
    p.add_argument("--data", type=Path, default=None,
                   help="text file to score (default: WikiText-2 test, data/wikitext2/test.txt)")
    p.add_argument("--out", type=Path, default=None, help="write results JSON here")
    p.add_argument("--activity", type=Path, default=None, metavar="JSON",
                   help="with --hardware: write the engine's activity (its bit-accurate model's counts per "
                        "layer, summed over --activity-window steps) here (golden/llm/activity.py)")
    p.add_argument("--activity-window", action=AtLeast, default=64, metavar="N",
                   help="decode steps per window of the activity record (64)")
    p.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")
    p.add_argument("--threads", action=AtLeast, minimum=0, default=1,
                   help="torch CPU threads (1 is fastest for the many small ops of LAD/MAC; 0 = torch default)")
    p.add_argument("--no-progress", action="store_true")
    return p


def check_lengths(args) -> None:
    """Every position the run feeds within the model's ``max_position_embeddings`` (read from the
    model package's metadata, no weights loaded); the parser has already bounded each count."""
    limit = max_positions(args.model)
    runs = [("--context", args.context, "--tokens", args.tokens, args.context + args.tokens + 1)]  # + the scored last
    if args.prompts:  # the last generated token is never fed back
        runs.append(("--prompt-len", args.prompt_len, "--new-tokens", args.new_tokens,
                     args.prompt_len + args.new_tokens - 1))
    for flag_a, a, flag_b, b, positions in runs:
        if positions > limit:
            raise ConfigError(f"{flag_a} {a} with {flag_b} {b} needs {positions} positions; {args.model} has "
                              f"max_position_embeddings {limit}")


def method_configs(method: str, args):
    """``(config of the method, LadTileConfig / MacDecodeConfig or None)`` from the defaults and ``--set``."""
    cfg, engine = _method_configs(method, args)
    full = layer_set(cfg.full_layers) if method == "mac" else None
    if full and max(full) >= MODEL_LAYERS:
        raise ConfigError(f"full_layers: SmolLM2 has layers 0..{MODEL_LAYERS - 1}, got {cfg.full_layers!r}")
    return cfg, engine


def _method_configs(method: str, args):
    if method == "mac" and getattr(args, "hardware", False):
        eng = configure(MacDecodeConfig(), args.set)
        if eng.head_dim != MODEL_HEAD_DIM:
            raise ConfigError(f"MacDecodeConfig: head_dim is {MODEL_HEAD_DIM} for SmolLM2, got {eng.head_dim}")
        longest = max(args.context + args.tokens, args.prompt_len + args.new_tokens if args.prompts else 0)
        if longest > eng.max_positions:
            raise ConfigError(f"--hardware: a context of {longest} tokens exceeds the engine's KV memory "
                              f"(max_positions = {eng.max_positions})")
        return eng.reference(), eng
    if not getattr(args, "hardware", False):
        cfg = configure(BASE_CONFIGS[method], args.set)
        fixed = [name for name in parse_overrides(args.set) if method == "lad" and name in MODEL_FIELDS]
        if fixed:
            raise ConfigError(f"LadConfig: {fixed[0]} is set from the model (head_dim 64, scale 1/8); "
                              f"it cannot be overridden here")
        return cfg, None
    tile = configure(LadTileConfig(), args.set)
    if tile.head_dim != MODEL_HEAD_DIM:
        raise ConfigError(f"LadTileConfig: head_dim is {MODEL_HEAD_DIM} for SmolLM2, got {tile.head_dim}")
    longest = max(args.context + args.tokens, args.prompt_len + args.new_tokens if args.prompts else 0)
    if longest > tile.kv_positions:     # past max_positions the tile's steps are exact passes
        raise ConfigError(f"--hardware: a context of {longest} tokens exceeds the tile's KV memory "
                          f"(kv_positions = {tile.kv_positions})")
    return BASE_CONFIGS[method], tile


def run_variants(method: str, args, cfg, tile_cfg) -> dict[str, tuple[str, dict]]:
    """The variants this run evaluates, name -> (attention method, its config keyword): the
    method, its --ablate variant, with --hardware the tile's float twin and the tile; only those
    named by ``--variants`` if given (checked before the model loads)."""
    kw = "lad" if method == "lad" else "mac"
    variants = {method: (method, {kw: cfg})}
    if args.ablate:
        variants[f"{method}-{'exact-scores' if method == 'lad' else 'exact-prefix'}"] = (method, {kw: replace(
            cfg, **({"exact_scores": True} if method == "lad" else {"exact_prefix": True}))})
    if isinstance(tile_cfg, MacDecodeConfig):
        variants["mac-decode"] = ("mac-decode", {"mac": tile_cfg})
    elif tile_cfg is not None:
        variants["lad-tile-float"] = ("lad", {"lad": tile_cfg.reference()})
        variants["lad-tile"] = ("lad-tile", {"tile": tile_cfg})
    if not args.variants:
        return variants
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in variants]
    if unknown or not chosen:
        raise ConfigError(f"--variants: '{','.join(unknown) or args.variants}' is not among this run's variants "
                          f"({', '.join(variants)})")
    return {name: v for name, v in variants.items() if name in chosen}


def main(method: str, argv: list[str]) -> int:
    """``ladmac eval lad|mac [options]``: prints a table, writes JSON / PNGs; returns the exit code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if method not in DEFAULTS:
        raise ConfigError(f"unknown method '{method}' (known: lad, mac)")
    args = build_parser(method).parse_args(argv)
    if args.model not in MODELS:
        raise ConfigError(f"unknown model '{args.model}' (known: {', '.join(MODELS)})")
    cfg, tile_cfg = method_configs(method, args)
    variants = run_variants(method, args, cfg, tile_cfg)
    if args.activity and not any(name in HARDWARE for name in variants):
        raise ConfigError("--activity records an engine's bit-accurate model: it needs --hardware "
                          f"(and, with --variants, {' or '.join(HARDWARE)})")
    check_lengths(args)
    # everything that needs no model is checked before the (slow) model load
    text = read_wikitext(args.data)
    check_outputs(args.out, args.plot, activity=args.activity)
    progress = not args.no_progress
    t_start = time.time()
    model, tokenizer = load_model(args.model)
    ctl = Controller(model)
    stride = max(64, args.prompt_len // 8)  # prompt i starts at token i * stride
    need = max(args.offset + args.context + args.tokens + 1, (args.prompts - 1) * stride + args.prompt_len)
    if args.threads:
        torch.set_num_threads(args.threads)
    ids = wikitext_ids(tokenizer, need, args.data, text=text)

    results = {"method": method, "model": args.model, "command": "ladmac eval " + " ".join([method, *argv]),
               "data": describe_text(args.data), "config": cfg.to_dict(),
               **({("engine_config" if method == "mac" else "tile_config"): tile_cfg.to_dict()} if tile_cfg else {}),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    seq = ids[args.offset:args.offset + args.context + args.tokens + 1]
    nll_full, _ = full_parallel(ctl, seq, args.context)
    ppl = {"full": perplexity(nll_full)}
    stats = {}
    steps = {}
    for name, (m_name, m_kw) in variants.items():
        nll, _, st = teacher_forced(ctl, seq, m_name, args.context, progress=progress, desc=f"{name} ppl", **m_kw)
        ppl[name] = perplexity(nll)
        stats[name] = st
        steps[name] = list(ctl.steps)
        if args.activity and name in HARDWARE:
            config = m_kw["tile"] if name == "lad-tile" else m_kw["mac"]
            write_json(args.activity, activity(
                ctl.layer_steps, args.activity_window, engine=name, model=args.model, data=describe_text(args.data),
                command=results["command"], context=args.context, tokens=args.tokens,
                config=config.to_dict(), perplexity_delta_pct=100.0 * (ppl[name] / ppl["full"] - 1)))
    results["perplexity"] = ppl
    results["perplexity_delta_pct"] = {k: 100.0 * (v / ppl["full"] - 1) for k, v in ppl.items()}
    results["teacher_forced_stats"] = stats

    generated = {"generation": variants[method]} if method in variants else {}
    if "lad-tile" in variants:
        generated["generation_hardware"] = variants["lad-tile"]
    if "mac-decode" in variants:
        generated["generation_hardware"] = variants["mac-decode"]
    for key, (m_name, m_kw) in generated.items():
        gen, gen_stats = [], []
        for i in range(args.prompts):
            prompt = ids[i * stride:i * stride + args.prompt_len]
            ref, out, st = greedy_pair(ctl, prompt, args.new_tokens, m_name, progress=progress,
                                       desc=f"{m_name} gen {i + 1}/{args.prompts}", **m_kw)
            gen.append({**generation_scores(out, ref), "reference": tokenizer.decode(ref),
                        "output": tokenizer.decode(out)})
            gen_stats.append(st)
        if gen:
            results[key] = {
                "method": m_name, "prompts": args.prompts, "new_tokens": args.new_tokens,
                "prompt_len": args.prompt_len, "prompt_stride": stride,
                "rouge_l_mean": sum(g["rouge_l"] for g in gen) / len(gen),
                "token_agreement_mean": sum(g["token_agreement"] for g in gen) / len(gen),
                "identical": sum(g["first_divergence"] == args.new_tokens for g in gen),
                "per_prompt": gen, "stats": gen_stats}
    results["seconds"] = time.time() - t_start
    if method == "mac" and method in steps:
        results["steps"] = steps[method]
    if "mac-decode" in steps:
        results["steps_hardware"] = steps["mac-decode"]
    print_table(method, results)
    if args.out:
        write_json(args.out, results)
    if args.plot:
        for path in decode_plots(method, results, args.plot):
            print(f"wrote {path}")
    return 0


def print_table(method: str, r: dict) -> None:
    print(f"\n{method.upper()} on SmolLM2-135M, teacher-forced ({r['args']['tokens']} tokens after "
          f"{r['args']['context']} context) on {r['data']}")
    print(f"  {'variant':<22}{'perplexity':>12}{'vs full':>10}")
    for k, v in r["perplexity"].items():
        print(f"  {k:<22}{v:>12.4f}{r['perplexity_delta_pct'][k]:>+9.3f}%")
    for name, st in r["teacher_forced_stats"].items():
        print(f"  stats {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in st.items()))
    for key in ("generation", "generation_hardware"):
        g = r.get(key)
        if g:
            print(f"  greedy generation ({g['method']}), {g['prompts']} prompts x {g['new_tokens']} tokens: ROUGE-L "
                  f"{100 * g['rouge_l_mean']:.2f}%, token agreement {100 * g['token_agreement_mean']:.2f}%, "
                  f"identical {g['identical']}/{g['prompts']}")
    print(f"  ({r['seconds']:.0f} s)")


if __name__ == "__main__":  # python -m golden.llm.decode_eval lad|mac ...
    from ..errors import LadmacError
    try:
        if len(sys.argv) < 2:
            raise ConfigError("usage: python -m golden.llm.decode_eval lad|mac [options]")
        sys.exit(main(sys.argv[1], sys.argv[2:]))
    except (LadmacError, OSError) as err:
        print(f"ladmac: error: {err}", file=sys.stderr)
        sys.exit(2)
