"""cocotb: dense PWL attention == golden.dense.dense_attention_bits, step after step (each of a
group's ``group`` query heads against the one KV memory), with
a KV memory model (random latency, request back-pressure, response gaps) and random
gaps/back-pressure on the query and output streams; random or real SmolLM2 q/k/v; params
``lengths`` (the steps' contexts, in turn; default random), ``max_len``, ``trace``, ``boundary``
(one step with every output on its rounding boundary), ``tie`` (one step with every output's sum
one below its rounding step)."""
from __future__ import annotations

import cocotb
import torch

from golden.dense import DenseConfig, dense_attention_bits, dense_normalise, dense_step_cycles, dense_weights
from golden.fixedpoint import round_shift, saturate
from golden.sfm import recip
from hdl.lad.dense import dense_out_layout, dense_query_layout, kv_request_layout, kv_response_layout
from testbenches.streams import Bench, kv_lookup, split_beats


def random_steps(cfg: DenseConfig, rng, steps: int, max_len: int, lengths: list[int] | None = None):
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    f = cfg.kv_format
    n_total = max_len
    scale = [rng.choice((0.5, 1.0, 3.0)) for _ in range(3)]
    k = f.quantize(torch.randn(n_total, cfg.head_dim, generator=gen) * scale[0])
    v = f.quantize(torch.randn(n_total, cfg.head_dim, generator=gen) * scale[1])
    k[0] = f.max_raw  # corner: extreme key and value rows
    v[1] = f.min_raw
    out = []
    for s in range(steps):
        length = lengths[s % len(lengths)] if lengths else rng.choice((1, 2, rng.randint(1, max_len), max_len))
        q = f.quantize(torch.randn(cfg.group, cfg.head_dim, generator=gen) * scale[2] * (4 if s % 5 == 0 else 1))
        out.append((q, length))
    return k, v, out


def trace_steps(cfg: DenseConfig, path: str, steps: int, max_len: int):
    """Steps of a recorded trace: one head's (``q``: tokens x d) or a KV group's (``q``: heads x
    tokens x d, the first ``group`` heads; ``k``, ``v`` of the first)."""
    t = torch.load(path)
    f = cfg.kv_format
    q, k, v = (f.quantize(t[name][..., :cfg.head_dim].float()) for name in ("q", "k", "v"))
    if q.dim() == 2:
        q = q[None]
    else:
        q, k, v = q[:cfg.group], k[0], v[0]
    if q.shape[0] != cfg.group:
        raise ValueError(f"the trace has {q.shape[0]} query heads, the config's group {cfg.group}")
    positions = torch.linspace(8, min(max_len, q.shape[1]) - 1, steps).round().long().tolist()
    return k, v, [(q[:, p], p + 1) for p in positions]


def boundary_step(cfg: DenseConfig, rng, positions: int = 3, attempts: int = 200):
    """A step whose every output element sits on its rounding boundary: its ``N_l`` one LSB below
    a value where ``golden.dense.dense_normalise`` steps, so an ``N`` off by one LSB changes ``o``.
    Random q and keys; per lane, random values but the largest weight's, which is searched over its
    whole range (about one hit a draw)."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    f = cfg.kv_format
    q = f.quantize(torch.randn(cfg.head_dim, generator=gen))
    k = f.quantize(torch.randn(positions, cfg.head_dim, generator=gen))
    p, _, z = dense_weights(q, k, cfg)
    top = int(p.argmax())
    values = torch.arange(f.min_raw, f.max_raw + 1)
    v = torch.zeros(positions, cfg.head_dim, dtype=torch.long)
    for lane in range(cfg.head_dim):
        for _ in range(attempts):
            v[:, lane] = f.quantize(torch.randn(positions, generator=gen) * 2)
            n = p[top] * values + (p * v[:, lane]).sum() - p[top] * v[top, lane]
            hits = (dense_normalise(n + 1, z, cfg) != dense_normalise(n, z, cfg)).nonzero().flatten()
            if len(hits):
                v[top, lane] = values[hits[rng.randrange(len(hits))]]
                break
        else:
            raise AssertionError(f"no rounding boundary for lane {lane} in {attempts} draws")
    return k, v, [(q[None], positions)]


def tie_step(cfg: DenseConfig, rng, positions: int = 3, attempts: int = 200):
    """A step whose every output element's sum ``N r + half`` is one below a multiple of ``2^s`` (s =
    frac + k, the output's shift): a sum one unit off (a rounding constant, a compressor's carry)
    moves every output element. ``N r`` hits that residue for one ``N`` in ``2^s`` (``r`` odd: draws
    until it is); per lane, random values but the two largest weights', solved for exactly."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    f = cfg.kv_format
    for _ in range(attempts):
        q = f.quantize(torch.randn(cfg.head_dim, generator=gen))
        k = f.quantize(torch.randn(positions, cfg.head_dim, generator=gen))
        p, _, z = dense_weights(q, k, cfg)
        r, kk = (int(t) for t in recip(torch.tensor([z]), cfg.sfm))
        a, b = (int(i) for i in p.argsort(descending=True)[:2])
        if r % 2 and int(p[b]) > 0:
            break
    else:
        raise AssertionError(f"no step with an odd reciprocal in {attempts} draws")
    shift = cfg.sfm.mantissa_frac + kk
    mod, half = 1 << shift, 1 << (shift - 1)
    target = (half - 1) * pow(r, -1, mod) % mod   # N with N r + half = -1 (mod 2^s)
    pa, pb = int(p[a]), int(p[b])
    values = torch.arange(f.min_raw, f.max_raw + 1)
    v = torch.zeros(positions, cfg.head_dim, dtype=torch.long)
    for lane in range(cfg.head_dim):
        for _ in range(attempts):
            v[:, lane] = f.quantize(torch.randn(positions, generator=gen) * 2)
            rest = int((p * v[:, lane]).sum()) - pa * int(v[a, lane]) - pb * int(v[b, lane])
            lo = rest + (pa + pb) * f.min_raw
            found, sums = None, list(range(lo + (target - lo) % mod, rest + (pa + pb) * f.max_raw + 1, mod))
            rng.shuffle(sums)
            for n in sums:
                rem = n - rest - pa * values                  # pb * v_b for each v_a
                ok = (rem % pb == 0) & (rem // pb >= f.min_raw) & (rem // pb <= f.max_raw)
                hits = ok.nonzero().flatten()
                if len(hits):
                    va = int(values[hits[rng.randrange(len(hits))]])
                    found = va, (n - rest - pa * va) // pb
                    break
            if found is None:
                continue
            v[a, lane], v[b, lane] = found
            n = int((p * v[:, lane]).sum())
            assert (n * r + half + 1) % mod == 0
            moved = dense_normalise(torch.tensor([n]), z, cfg) != saturate(round_shift(torch.tensor([n * r + 1]), shift), f)
            if bool(moved):   # not held at a saturation bound
                break
        else:
            raise AssertionError(f"no exact rounding tie for lane {lane} in {attempts} draws")
    return k, v, [(q[None], positions)]


@cocotb.test()
async def dense_matches_golden(dut):
    bench = await Bench.start(dut, DenseConfig)
    cfg, p = bench.cfg, bench.params
    max_len = min(p.get("max_len", 64), cfg.max_positions)
    if p.get("trace"):
        k, v, steps = trace_steps(cfg, p["trace"], bench.steps(4), max_len)
    elif p.get("boundary"):
        k, v, steps = boundary_step(cfg, bench.rng)
    elif p.get("tie"):
        k, v, steps = tie_step(cfg, bench.rng)
    else:
        k, v, steps = random_steps(cfg, bench.rng, bench.steps(20), max_len, p.get("lengths"))
    src, sink = bench.source("query", dense_query_layout(cfg)), bench.sink("out", dense_out_layout(cfg))
    memory = bench.memory("kv_req", kv_request_layout(cfg), "kv_resp", kv_response_layout(cfg),
                          kv_lookup(k, v, cfg.lanes), latency=(1, 6))
    g = cfg.group
    for s, (qs, length) in enumerate(steps):
        # g queries, head 0's beats first; the length is read with the step's first beat: the others
        # carry any length
        beats = [qb for q in qs for qb in split_beats(q, cfg.lanes)]
        src.put(*({"q": qb, "length": length if b == 0 else bench.rng.randrange(1 << cfg.position_width)}
                  for b, qb in enumerate(beats)))
        for h, q in enumerate(qs):
            o, m, z = dense_attention_bits(q, k[:length], v[:length], cfg)
            for b, ob in enumerate(split_beats(o, cfg.lanes)):
                sink.expect({"o": ob, "m": m, "z": z, "kv_beats": 2 * length * cfg.beats, **({"head": h} if g > 1 else {})},
                            inputs=f"step {s} head {h} beat {b}")
    total = sum(length for _, length in steps)
    await bench.drain(timeout_cycles=total * cfg.beats * 2 * 30 + 5000 * g)
    # the cycles each step reports against the schedule's model: equal when nothing stalls, else at least
    # (a step's every beat reports the group's cycles)
    per_step = [sink.received[i:i + g * cfg.beats] for i in range(0, len(sink.received), g * cfg.beats)]
    for s, beats_got in enumerate(per_step):
        bench.check(f"step {s}: every beat reports the step's cycles", len({got["cycles"] for _, got in beats_got}), 1)
    step_cycles = [beats_got[0][1]["cycles"] for beats_got in per_step]
    nothing_stalls = bench.gap == 0 and bench.stall == 0 and tuple(memory.latency) == (1, 1)
    for s, (cycles, (_, length)) in enumerate(zip(step_cycles, steps)):
        model = dense_step_cycles(cfg, length)
        if nothing_stalls:
            bench.check(f"step {s} cycles", cycles, model)
        else:
            bench.check(f"step {s} cycles at least the schedule's {model}", cycles >= model, True)
    bench.finish(vectors=len(steps), steps=len(steps), beats=len(sink.expected),
                 kv_requests=len(memory.requests.received),
                 step_cycles=step_cycles,
                 lengths=[length for _, length in steps],
                 nonzero_outputs=sum(1 for w, _ in sink.expected if any(w["o"])))
