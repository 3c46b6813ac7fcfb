"""The MAC decode engine's step sequences, shared by the model's tests (test_mac_decode.py) and the
RTL bench (tb_mac_decode.py): random sequences that reach hits, misses, ties and cancellations, and
a real SmolLM2 decode trace, raw in the engine's formats."""
from __future__ import annotations

import random
from pathlib import Path

import torch

from golden.mac_decode import MacDecodeConfig

DATA = Path(__file__).resolve().parent.parent / "data"


def random_sequence(cfg: MacDecodeConfig, H: int, Hkv: int, N: int, seed: int):
    """Raw ``(q_pre (N,H,d), q (N,H,d), k (Hkv,N,d), v (Hkv,N,d))``: pre-RoPE queries from a few
    clusters (hits), some exact repeats (distance ties); now and then a query aligned with the newest
    key at a large scale, so that the tail holds nearly all the mass (cancelled removals)."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    d = cfg.head_dim
    centers = torch.randn(5, d, generator=g) * 2
    q_pre = torch.empty(N, H, d)
    for n in range(N):
        for h in range(H):
            if n >= 2 and rnd.random() < 0.15:
                q_pre[n, h] = q_pre[rnd.randrange(max(0, n - cfg.window), n), h]    # exact repeat
            else:
                q_pre[n, h] = centers[rnd.randrange(5)] + torch.randn(d, generator=g) * rnd.choice((0.05, 0.3, 1.5))
    q = torch.randn(N, H, d, generator=g) * 1.5
    k = torch.randn(Hkv, N, d, generator=g) * 1.5
    v = torch.randn(Hkv, N, d, generator=g) * 2
    for n in range(N):
        if rnd.random() < 0.3:                                # the newest key dominates: cancellation
            for h in range(H):
                q[n, h] = k[h // (H // Hkv), n] * 3
    f = cfg.kv_format
    return cfg.q_format.quantize(q_pre), f.quantize(q), f.quantize(k), f.quantize(v)


def real_trace(cfg: MacDecodeConfig, steps: int, trace: Path | None = None, head_trace: Path | None = None):
    """Layer 12, query head 0 of SmolLM2 on WikiText-2 (testbenches/data, or the files
    benchmarks/record_mac_trace.py wrote at ``trace`` / ``head_trace``): pre-RoPE query, post-RoPE
    query, key and value of the first ``steps`` positions, raw in the engine's formats (one head,
    one KV head)."""
    head = torch.load(head_trace or DATA / "smollm2_head_trace.pt")
    q_pre = torch.load(trace or DATA / "smollm2_mac_trace.pt")["q_pre"][:steps, 0]
    f = cfg.kv_format
    return (cfg.q_format.quantize(q_pre.double()).unsqueeze(1), f.quantize(head["q"][:steps].double()).unsqueeze(1),
            f.quantize(head["k"][:steps].double()).unsqueeze(0), f.quantize(head["v"][:steps].double()).unsqueeze(0))
