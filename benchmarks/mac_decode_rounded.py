"""Where the decode engine's bit-accurate model departs from the float MAC reference inside SmolLM2:
the float reference fed the engine's rounded inputs (pre-RoPE q in s16.8, post-RoPE q, k, v in
s16.8; ``twin-rounded``) separates input rounding from the integer datapath.

    python -m benchmarks.mac_decode_rounded --context 2048 --tokens 256 --out build/results/mac_rounded_2048.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from golden.cli import add_overrides, configure_or_exit
from golden.mac_decode import MacDecodeConfig
from golden.mac_ref import MacLayerState


class RoundedMacLayerState(MacLayerState):
    """The float reference on the engine's quantised inputs (what MacDecodeLayer sees)."""
    engine = MacDecodeConfig()

    def _r(self, x, fmt):
        return fmt.to_float(fmt.quantize(x.double())).to(x.dtype)

    def prefill(self, q_pre, q_post, k, v):
        e = self.engine
        super().prefill(self._r(q_pre, e.q_format), self._r(q_post, e.kv_format), self._r(k, e.kv_format),
                        self._r(v, e.kv_format))

    def decode_step(self, q_pre, q_post, k, v, position):
        e = self.engine
        return super().decode_step(self._r(q_pre, e.q_format), self._r(q_post, e.kv_format),
                                   self._r(k, e.kv_format), self._r(v, e.kv_format), position)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--out", type=Path, required=True)
    add_overrides(p, "a MacDecodeConfig parameter (the engine whose inputs are rounded)")
    args = p.parse_args(argv)
    engine = configure_or_exit("mac_decode_rounded", MacDecodeConfig(), args.set)
    RoundedMacLayerState.engine = engine
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    import golden.llm.hooks as hooks
    from golden.llm.data import wikitext_ids
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, load_model, teacher_forced
    t0 = time.time()
    model, tokenizer = load_model()
    ctl = hooks.Controller(model)
    seq = wikitext_ids(tokenizer, args.context + args.tokens + 1)
    nll_full, _ = full_parallel(ctl, seq, args.context)
    hooks.MacLayerState = RoundedMacLayerState          # this script's process only
    nll, _, st = teacher_forced(ctl, seq, "mac", args.context, mac=engine.reference(), progress=False)
    res = {"command": "python -m benchmarks.mac_decode_rounded " + " ".join(argv or os.sys.argv[1:]),
           "perplexity_full": perplexity(nll_full), "perplexity_twin_rounded": perplexity(nll), "stats": st,
           "seconds": time.time() - t0}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "stats"}), st)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
