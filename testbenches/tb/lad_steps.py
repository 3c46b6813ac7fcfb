"""Shared by the LAD benches (tb_lad_tile and the per-module tb_lad_eas/apid/md/ac): the step
sequence (random ``kind``, or a real SmolLM2 head), run through golden.lad_tile.LadTileModel with
its trace on, giving per step a :class:`golden.lad_tile.StepTrace` of the transactions each module
sees and produces (the module benches play the tile sequencer and the neighbouring modules from
them); and the SFM's RECIP as a memory lookup."""
from __future__ import annotations

import torch

from golden.fixedpoint import round_shift
from golden.lad_tile import COS_FRAC, LadTileConfig, LadTileModel, StepTrace
from golden.sfm import recip
from testbenches.streams import Bench, split_beats


def random_sequence(cfg: LadTileConfig, seed: int, steps: int, kind: str):
    """Raw (steps, d) q, k, v of one synthetic head: ``drift`` (keys along few directions, slowly
    drifting queries, extreme rows), ``zero_interval`` (one dominant key: every other position far
    below the cutoff), ``all_active`` (unrelated queries every step: intervals move all the time)."""
    gen = torch.Generator().manual_seed(seed)
    d, f = cfg.head_dim, cfg.kv_format
    if kind == "zero_interval":
        k = torch.randn(steps, d, generator=gen) * 0.05
        q = torch.randn(d, generator=gen).expand(steps, d) * 3.0
        k[0] = q[0] * 1.0
        v = torch.randn(steps, d, generator=gen)
    elif kind == "all_active":
        k = torch.randn(steps, d, generator=gen) * 1.5
        q = torch.randn(steps, d, generator=gen) * 4.0 * torch.where(torch.arange(steps) % 2 == 0, 1.0, -1.0)[:, None]
        v = torch.randn(steps, d, generator=gen) * 2.0
    else:
        base = torch.randn(6, d, generator=gen)
        k = base[torch.randint(0, 6, (steps,), generator=gen)] * torch.randn(steps, 1, generator=gen) \
            + 0.02 * torch.randn(steps, d, generator=gen)
        drift = torch.cumsum(torch.randn(steps, d, generator=gen) * 0.15, 0)
        q = 1.5 * torch.randn(d, generator=gen) + drift
        v = torch.randn(steps, d, generator=gen) * 2.0
        v[1:2] = 127.0               # corner: extreme value rows (where the sequence is that long)
        k[2:3] = -100.0
    return f.quantize(q), f.quantize(k), f.quantize(v)


def eas_corners(cfg: LadTileConfig, k: torch.Tensor, rng) -> torch.Tensor:
    """EAS corner keys on the first steps and one late step: a tiny first center, a zero key
    (|k|^2 = 0 becomes a center, RECIP(0)), keys along the tiny center 200x longer in both
    signs (rho saturates at +-max), its negation (rho = -1), a center and two keys whose join
    verdict t's rounding decides (:func:`rounding_keys`), a center 4x the tiny one's norm and a
    key joining it (its rho shift 2 more than the tiny center's: 1 at rho_frac 22, the smallest
    right shift), two centers and a key whose t over them differ in the lowest bit alone
    (:func:`tie_keys`), and a zero key once the table may be full (joins with rho = 0)."""
    k = k.clone()
    d, steps = cfg.head_dim, k.shape[0]
    tiny = torch.tensor([rng.choice((-1, 1)) for _ in range(d)], dtype=torch.int64)
    rows = [tiny, torch.zeros(d, dtype=torch.int64), 200 * tiny, -200 * tiny, -tiny]
    rows += rounding_keys(cfg, torch.Generator().manual_seed(rng.randrange(1 << 30)))
    # a center with |c|^2 = 4 d across the tiny one (half its signs flipped), then a key equal to it:
    # rho's shift e + mf - rho_frac is one more than at the tiny center's 4x smaller norm
    across = 2 * tiny * torch.where(torch.arange(d) < d // 2, 1, -1)
    rows += [across, across]
    rows += tie_keys(cfg, rows, torch.Generator().manual_seed(rng.randrange(1 << 30)))
    for i, row in enumerate(rows[:steps]):
        k[i] = row
    if steps > 3 * cfg.max_centers:
        k[steps - 3] = 0
    return k


def rounding_keys(cfg: LadTileConfig, gen: torch.Generator) -> list[torch.Tensor]:
    """A small center c and two keys whose join verdict (``t << COS_FRAC >= cos2 kk``, docs/algorithms.md
    §1.4) the rounding of ``t = round_shift(dot^2 rc, mf + e)`` decides: the exact quotient
    ``dot^2 rc / 2^(mf + e)`` lies within a unit below the threshold's integer T. The first has its
    fraction in [1/2, 3/4): it joins c only because t rounds up (truncated, or with a quarter added,
    t = T - 1); the second's is below 1/2: it stays out only because t rounds down (with a whole
    unit added it would join)."""
    d, mf = cfg.head_dim, cfg.sfm.mantissa_frac
    c = torch.randint(-8, 9, (d,), generator=gen)
    cc = int((c * c).sum())
    rc, e = (int(t) for t in recip(torch.tensor([cc]), cfg.sfm))
    shift = mf + e
    draws = 1 << 15   # about 30 and 140 of each kind at the small preset
    scale = torch.rand(draws, 1, generator=gen) * 0.4
    k = c + (torch.randn(draws, d, generator=gen) * scale * 8).round().long()
    dot, kk = (k * c).sum(-1), (k * k).sum(-1)
    product = dot * dot * rc
    below = (product >> shift) == -((-cfg.cos2_raw * kk) >> COS_FRAC) - 1     # the quotient's floor = T - 1
    frac = product & ((1 << shift) - 1)
    half, quarter = 1 << (shift - 1), 1 << (shift - 2)
    up, down = torch.nonzero(below & (frac >= half) & (frac < half + quarter)), torch.nonzero(below & (frac < half))
    if not (len(up) and len(down)):
        raise ValueError(f"rounding_keys: no key's verdict t's rounding decides in {draws} draws at {cfg}")
    return [c, k[up[0, 0]], k[down[0, 0]]]


def tie_keys(cfg: LadTileConfig, rows: list[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor]:
    """Two new centers a, b (after ``rows``' keys) and a key that joins b because its ``t_b`` is one
    more than ``t_a``, the first maximum of the rest, with ``t_a`` even: a compare of t blind to its
    lowest bit would keep a (docs/algorithms.md §1.4: the first maximum of t wins). a has random
    elements up to 8 x 32 raw (at the small preset, the longest center: the extreme query of
    :func:`sequence` is signed as a or b), b is a turned 16 degrees (a new center at the cos^2 0.96
    of the presets), the keys drawn about their bisector."""
    d, mf, draws = cfg.head_dim, cfg.sfm.mantissa_frac, 1 << 14
    eas = LadTileModel(cfg)
    for row in rows:
        eas.center_update(row)
    for _ in range(16):
        a = torch.randint(-8, 9, (d,), generator=gen) * 32
        turn = torch.randn(d, generator=gen, dtype=torch.float64)
        turn -= (turn @ a.double()) / (a.double() @ a.double()) * a.double()
        b = (a + turn / turn.norm() * a.double().norm() * 0.29).round().long()
        first = eas.n_centers
        if first + 2 > cfg.max_centers:
            break
        if not (eas.center_update(a)[2] and eas.center_update(b)[2]):   # a or b joined a center
            del eas.center_recip[first:]
            continue
        mid = a.double() / a.double().norm() + b.double() / b.double().norm()
        k = (mid * torch.rand(draws, 1, generator=gen, dtype=torch.float64) * 40
             + torch.randn(draws, d, generator=gen, dtype=torch.float64) * 0.6).round().long()
        C = eas.n_centers
        dots = k @ eas.centers[:C].T
        rc, e = (torch.tensor(x) for x in zip(*eas.center_recip))
        t = round_shift(dots * dots * rc, mf + e)   # EAS's t_j, every key x center
        kk = (k * k).sum(-1)
        best = t.max(-1)
        lower = t.clone()
        lower[:, first + 1] = -1
        ok = ((best.indices == first + 1) & (best.values % 2 == 1) & (t[:, first] == best.values - 1)
              & (lower.max(-1).values == t[:, first]) & (kk > 0) & ((best.values << COS_FRAC) >= cfg.cos2_raw * kk))
        hits = torch.nonzero(ok)
        if len(hits):
            return [a, b, k[hits[0, 0]]]
        del eas.center_recip[first:]
    raise ValueError(f"tie_keys: no key whose t decides a center by its lowest bit in 16 x {draws} draws at {cfg}")


def sequence(bench: Bench):
    """Raw (steps, d) q, k, v of the run: ``trace`` (head ``head`` of a SmolLM2 file), else
    ``kind`` of :func:`random_sequence`; ``eas_corners`` puts the EAS corner keys in (and one
    query at the format's extremes, along the longest center). With ``group`` g > 1, q is the
    group's (g, steps, d): a trace's group ``head`` (its heads ``head * g ..``, one KV group's), or g
    random query sequences against the one key sequence."""
    cfg, rng, p = bench.cfg, bench.rng, bench.params
    steps, g = bench.steps(24), cfg.group
    if p.get("trace"):
        t = torch.load(p["trace"])
        h, f = p.get("head", 0), cfg.kv_format
        if g == 1:
            q, k, v = (f.quantize(t[name][h, :steps, :cfg.head_dim].float()) for name in ("q", "k", "v"))
        else:   # group h: the file's heads h g .. h g + g - 1, one KV group's
            if (h + 1) * g > t["q"].shape[0]:
                raise ValueError(f"group {h} of {g} heads: the trace has {t['q'].shape[0]} heads")
            q = f.quantize(t["q"][h * g:(h + 1) * g, :steps, :cfg.head_dim].float())
            k, v = (f.quantize(t[name][h * g, :steps, :cfg.head_dim].float()) for name in ("k", "v"))
    else:
        kind = p.get("kind", "drift")
        q, k, v = random_sequence(cfg, rng.randrange(1 << 30), steps, kind)
        if g > 1:
            q = torch.stack([q] + [random_sequence(cfg, rng.randrange(1 << 30), steps, kind)[0] for _ in range(g - 1)])
    if p.get("eas_corners"):
        k = eas_corners(cfg, k, rng)
        # one query at the kv format's extremes, signed as the longest center made before it (the
        # centers follow from the keys alone): its score saturates the score format, and so does s^
        # at any rho beyond 1 (the bench's extra lookup of that center at an extreme rho)
        n, eas = steps // 2, LadTileModel(cfg)
        for i in range(n):
            eas.center_update(k[i])
        longest = eas.centers[int((eas.centers ** 2).sum(-1).argmax())]
        q = q.clone()
        q[..., n, :] = torch.where(longest < 0, cfg.kv_format.min_raw, cfg.kv_format.max_raw)
    return q, k, v


def head_payload(cfg: LadTileConfig, values):
    """A stream payload of one value per query head (hdl.lad.common.per_head): the value itself at
    group 1, else the list."""
    values = list(values)
    return values[0] if cfg.group == 1 else values


def payload_heads(cfg: LadTileConfig, payload) -> list:
    """A per-head stream payload as a list of one value per query head."""
    return [payload] if cfg.group == 1 else list(payload)


def golden_records(cfg: LadTileConfig, q, k, v) -> tuple[LadTileModel, list[StepTrace]]:
    """The model after the sequence, and the trace of every (non-overflow) step."""
    trace: list[StepTrace] = []
    model = LadTileModel(cfg, trace=trace)
    for i in range(q.shape[0]):
        model.step(q[i], k[i], v[i])
    return model, trace


def beats(vec, cfg: LadTileConfig) -> list[list[int]]:
    """A d-vector as its ``beats`` transfers of ``lanes`` elements."""
    return split_beats(vec, cfg.lanes)


def sfm_recip(cfg: LadTileConfig):
    """``lookup`` of the SFM's RECIP port: request z -> {mantissa, exponent} (golden.sfm.recip)."""
    def lookup(z):
        m_, e_ = (int(t) for t in recip(torch.tensor([z]), cfg.sfm))
        return {"mantissa": m_, "exponent": e_}
    return lookup


async def open_bench(dut):
    """The common opening of a module bench: clock, reset and context, the step sequence run
    through the golden model with its trace on. Returns ``bench, (q, k, v), model, trace``."""
    bench = await Bench.start(dut, LadTileConfig)
    q, k, v = sequence(bench)
    model, recs = golden_records(bench.cfg, q, k, v)
    return bench, (q, k, v), model, recs


async def load_vector(bench: Bench, source, vec, **fields) -> None:
    """``vec`` (q or k_n) into a module's own copy (hdl.lad.common.beat_copy) over ``source``, the
    bench's StreamSource on its ``q_load`` / ``k_load`` (layout ``beat_load_layout``): a beat a
    transfer as the tile sends them, but in a random order (the copy is addressed by beat) with the
    source's random gaps and idle payload (``fields``: more of each beat's payload, a group's ``head``);
    returns once every beat is written."""
    order = list(enumerate(split_beats(vec, bench.cfg.lanes)))
    bench.rng.shuffle(order)
    source.put(*({"beat": b, "data": beat, **fields} for b, beat in order))
    await bench.until(lambda: source.idle, 100 * len(order), f"{source.name} loaded")
