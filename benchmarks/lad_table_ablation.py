"""What a bounded center table costs LAD inside SmolLM2, and how much of the LAD tile's loss is its datapath.

    .venv/bin/python -m benchmarks.lad_table_ablation [--tokens 512]
        [--variants twin twin-rounded exact-rule tile] [--max-centers 256] [--out JSON]

Teacher-forced perplexity of ``tokens`` WikiText-2 test tokens (decoded from position 0; the same
tokens as ``ladmac eval lad --tokens N``),
one variant after another, each against full attention on the same tokens:

- ``twin``: the float reference (golden/lad_ref.py) with the tile's parameters
  (``LadTileConfig(max_centers=M).reference()``; full table: a key joins its best center);
- ``twin-rounded``: the same, fed q, k, v rounded to the tile's s16.8 and with ``o`` rounded
  to s16.8: the tile's input/output rounding without its integer datapath;
- ``exact-rule``: the float reference with ``full_table="exact"`` (a key that matches no center
  while the table is full gets none and is a candidate at every step);
- ``tile``: the tile's bit-accurate model (golden/lad_tile.py, bit-exact with the RTL), one per
  query head of every layer (slow: about 5 s per token on one core).

Prints one row per variant (perplexity, change vs full attention, keys read, misses where the
float reference reports them) and writes them as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from golden.errors import ConfigError, LadmacError
from golden.lad_ref import LadHead
from golden.lad_tile import ONE_HEAD_V2, LadTileConfig
from golden.llm.data import read_wikitext, wikitext_ids
from golden.llm.hooks import Controller
from golden.llm.metrics import perplexity
from golden.llm.runs import load_model, teacher_forced

VARIANTS = ("twin", "twin-rounded", "exact-rule", "tile")


class RoundedLadHead(LadHead):
    """The float reference behind the tile's s16.8 rounding of q, k, v (in) and o (out)."""
    fmt = LadTileConfig().kv_format

    def _round(self, t: torch.Tensor) -> torch.Tensor:
        return self.fmt.to_float(self.fmt.quantize(t)).to(t.dtype)

    def step(self, q, k_new, v_new):
        o, stats = super().step(self._round(q), self._round(k_new), self._round(v_new))
        return self._round(o), stats


def run_variant(ctl: Controller, ids, name: str, max_centers: int) -> dict:
    tile = LadTileConfig(max_centers=max_centers, **ONE_HEAD_V2)   # one head, keys as centers: the table rules' study
    twin = tile.reference()
    kw = {"twin": ("lad", {"lad": twin}), "twin-rounded": ("lad", {"lad": twin}),
          "exact-rule": ("lad", {"lad": dataclasses.replace(twin, full_table="exact")}),
          "tile": ("lad-tile", {"tile": tile})}[name]
    ctl.lad_head = RoundedLadHead if name == "twin-rounded" else LadHead
    try:
        t0 = time.time()
        nll, _, stats = teacher_forced(ctl, ids, kw[0], desc=name, **kw[1])
    finally:
        ctl.lad_head = LadHead
    row = {"variant": name, "max_centers": max_centers, "ppl": perplexity(nll), "wall_s": round(time.time() - t0, 1)}
    row.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--max-centers", type=int, default=256)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        if args.tokens < 1:
            raise ConfigError(f"--tokens must be at least 1, got {args.tokens}")
        LadTileConfig(max_centers=args.max_centers)   # validates
        text = read_wikitext()
        model, tok = load_model()
        ids = wikitext_ids(tok, args.tokens + 1, text=text)   # as ladmac eval: N scored tokens
    except LadmacError as err:
        print(f"lad_table_ablation: error: {err}", file=sys.stderr)
        return 2
    ctl = Controller(model)
    nll, _, _ = teacher_forced(ctl, ids, "full", desc="full")
    full = perplexity(nll)
    rows = [{"variant": "full", "ppl": full}]
    print(f"{'variant':<14}{'ppl':>9}{'vs full':>9}{'keys read':>11}{'missed':>8}{'wall s':>8}", flush=True)
    print(f"{'full':<14}{full:>9.3f}", flush=True)
    for name in args.variants:
        r = run_variant(ctl, ids, name, args.max_centers)
        r["vs_full_pct"] = 100 * (r["ppl"] / full - 1)
        rows.append(r)
        missed = f"{r['missed_pct']:.2f}%" if "missed_pct" in r else "n/a"
        print(f"{name:<14}{r['ppl']:>9.3f}{r['vs_full_pct']:>+8.2f}%{r.get('keys_read_pct', 0):>10.1f}%"
              f"{missed:>8}{r['wall_s']:>8.0f}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tokens": args.tokens, "max_centers": args.max_centers, "rows": rows},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
