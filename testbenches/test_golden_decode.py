"""Float references of LAD (golden/lad_ref.py) and MAC (golden/mac_ref.py) on their own and inside
SmolLM2-135M decoding (golden/llm/: hooks, runs, metrics; ``ladmac eval`` in decode_eval.py): exactness
with the approximations disabled, merge/downdate algebra incl. cancellation, the perplexity cost of each
method, and the command line's checks (before the model loads)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from golden.errors import ConfigError
from golden.lad_ref import FULL_ATTENTION, LadConfig, LadHead, full_attention
from golden.mac_ref import (MacConfig, attend, downdate_states, empty_state, match,
                            merge_states)

SEED = 20250711


# -- (b) merge / downdate algebra -------------------------------------------------------------------
def _split_states(seed, n=200, d=16, cut=120, scale=0.5):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(d, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(n, d, generator=gen, dtype=torch.float64)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return (attend(q, k[:cut], v[:cut], scale), attend(q, k[cut:], v[cut:], scale), attend(q, k, v, scale))


@pytest.mark.parametrize("seed", [SEED + i for i in range(8)])
def test_merge_and_downdate_random(seed):
    (o1, l1), (o2, l2), (of, lf) = _split_states(seed, cut=40 + 15 * (seed - SEED))
    om, lm = merge_states(o1, l1, o2, l2)
    assert torch.allclose(om, of, atol=1e-12) and torch.allclose(lm, lf, atol=1e-12)
    assert of.abs().max() > 0.05                                   # non-trivial state
    od, ld, canc = downdate_states(of, lf, o2, l2, cancel_bound=1e-9)
    assert not bool(canc)
    assert torch.allclose(od, o1, atol=1e-9) and torch.allclose(ld, l1, atol=1e-12)
    # commutative merge, batched shapes
    ob, lb = merge_states(torch.stack([o1, o2]), torch.stack([l1, l2]), torch.stack([o2, o1]), torch.stack([l2, l1]))
    assert torch.allclose(ob[0], ob[1], atol=1e-12) and torch.allclose(lb[0], lb[1])


def test_merge_and_downdate_corner_cases():
    d = 8
    eo, el = empty_state((), d)
    (o1, l1), (o2, l2), _ = _split_states(SEED, d=d)
    # the empty state is neutral for merge and removing it is the identity
    for a, b in ((merge_states(eo, el, o1, l1)), (merge_states(o1, l1, eo, el))):
        assert torch.equal(a, o1) and torch.equal(b, l1)
    o, l = merge_states(eo, el, eo, el)
    assert torch.equal(o, torch.zeros(d)) and l == -math.inf
    o, l, c = downdate_states(o1, l1, eo, el)
    assert not bool(c) and torch.allclose(o, o1) and l == l1
    # removing a state from itself, or one holding almost all the mass, is flagged, never garbage
    o, l, c = downdate_states(o1, l1, o1, l1)
    assert bool(c) and l == -math.inf and torch.equal(o, torch.zeros(d))
    o, l, c = downdate_states(o1, l1, o2, l1 - 1e-4)
    assert bool(c) and torch.isfinite(o).all()
    # removing from the empty state, and 1 - t just on either side of the bound
    o, l, c = downdate_states(eo, el, o1, l1)
    assert bool(c) and torch.isfinite(o).all()
    bound = 1 / 64
    for one_minus_t, flagged in ((bound * 1.01, False), (bound * 0.99, True)):
        _, l, c = downdate_states(o1, l1, o2, l1 + math.log(1 - one_minus_t), cancel_bound=bound)
        assert bool(c) == flagged
        if not flagged:
            assert abs(float(l) - (float(l1) + math.log(one_minus_t))) < 1e-9
    # large score offsets do not overflow (only exp of non-positive differences)
    o, l = merge_states(o1, l1 + 700.0, o2, l2 - 700.0)
    assert torch.allclose(o, o1) and torch.isfinite(l)


def test_downdate_flags_cancellation_on_random_states():
    gen = torch.Generator().manual_seed(SEED)
    flagged = kept = 0
    for _ in range(200):
        d = 8
        q = torch.randn(d, generator=gen, dtype=torch.float64) * 3
        k = torch.randn(20, d, generator=gen, dtype=torch.float64)
        v = torch.randn(20, d, generator=gen, dtype=torch.float64)
        full, tail, head = attend(q, k, v, 1.0), attend(q, k[2:], v[2:], 1.0), attend(q, k[:2], v[:2], 1.0)
        o, l, c = downdate_states(*full, *tail, cancel_bound=1 / 64)
        t = math.exp(float(tail[1] - full[1]))
        assert bool(c) == (1 - t < 1 / 64)
        if c:
            flagged += 1
            assert torch.equal(o, torch.zeros(d))
        else:
            kept += 1
            # the error is bounded by the amplification 1/(1-t) of float rounding
            assert (o - head[0]).abs().max() < 1e-12 / (1 - t) * 10
    assert flagged > 10 and kept > 10


def test_match_ties_to_lower_position_and_threshold():
    d, M = 4, 6
    ring = torch.zeros(2, M, d, dtype=torch.float64)
    pos = torch.tensor([12, 7, 8, 9, 10, 11])                      # slot = position mod 6
    valid = torch.ones(2, M, dtype=torch.bool)
    q = torch.zeros(2, d, dtype=torch.float64)
    ring[0, 0] = ring[0, 3] = 0.1                                  # equal distance at positions 12 and 9
    ring[0, [1, 2, 4, 5]] = 5.0
    ring[1] = 5.0
    ring[1, 4] = 0.3
    hit, p, dist = match(ring, pos, valid, q, threshold=1.0)
    assert hit.tolist() == [True, True] and p.tolist() == [9, 10]
    assert abs(float(dist[0]) - 0.2) < 1e-12
    hit, p, _ = match(ring, pos, valid, q, threshold=0.2)          # strict <
    assert hit.tolist() == [False, False] and p.tolist() == [9, 10]
    valid[1, 4] = False
    hit, p, _ = match(ring, pos, valid, q, threshold=100.0)
    assert p[1] == 7                                               # all others tie at distance 10
    # distances equal up to rounding (a relative 1e-9, inside TIE_TOLERANCE) tie: the lower position
    ring[0, 0] = 0.1 * (1 - 1e-9)                                  # position 12, a hair closer
    hit, p, _ = match(ring, pos, valid, q, threshold=1.0)
    assert p[0] == 9
    ring[0, 0] = 0.1 * (1 - 1e-4)                                  # a real gap: the closer one
    hit, p, _ = match(ring, pos, valid, q, threshold=1.0)
    assert p[0] == 12
    assert MacConfig().threshold(64) == pytest.approx(math.sqrt(128) * 0.55)


def test_mac_unit_reference_config_is_derived():
    """The bit-accurate unit's float twin carries its window, tau and cancellation bound."""
    from golden.mac_unit import PRESETS, MacUnitConfig
    assert MacUnitConfig().reference() == MacConfig()               # the defaults agree
    unit = MacUnitConfig(window=24, head_dim=32, heads=3, lanes=8, tau=0.3, cancel_bits=4)
    ref = unit.reference()
    assert (ref.window, ref.tau, ref.cancel_bound) == (24, 0.3, 1 / 16)
    assert ref.band == MacConfig().band and ref.min_context == MacConfig().min_context
    assert PRESETS["tiny"].reference().window == 8


def test_configs_reject_bad_values():
    with pytest.raises(ConfigError, match="center_cos"):
        LadConfig(center_cos=1.5)
    with pytest.raises(ConfigError, match="exact_exp"):
        LadConfig(exact_exp=True)
    with pytest.raises(ConfigError, match="m_rule"):
        LadConfig(m_rule="guess")
    with pytest.raises(ConfigError, match="tau"):
        MacConfig(tau=0.0)
    with pytest.raises(ConfigError, match="cancel_bound"):
        MacConfig(cancel_bound=1.0)


# -- LAD reference on its own ---------------------------------------------------------------------
def _lad_data(seed, H=3, n=96, d=32):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(6, d, generator=gen)
    k = base[torch.randint(0, 6, (H, n), generator=gen)] * torch.randn(H, n, 1, generator=gen) \
        + 0.01 * torch.randn(H, n, d, generator=gen)              # keys along a few directions
    v = torch.randn(H, n, d, generator=gen)
    q = torch.randn(H, n, d, generator=gen) * 0.7 + 1.5 * torch.randn(d, generator=gen)  # slowly drifting queries
    return q, k, v


@pytest.mark.parametrize("exact_recent", [1, 4])
def test_lad_invariants_and_exact_modes(exact_recent):
    q, k, v = _lad_data(SEED + exact_recent)
    H, n, d = k.shape
    heads = {name: LadHead(LadConfig(head_dim=d, exact_recent=exact_recent, **kw), H)
             for name, kw in (("full", FULL_ATTENTION), ("pwl", dict(exact_scores=True)), ("lad", {}))}
    one = LadHead(LadConfig(head_dim=d, exact_recent=exact_recent))
    totals = {"active": 0, "missed": 0, "mode_changes": 0, "candidates": 0}
    for i in range(n):
        outs = {name: h.step(q[:, i], k[:, i], v[:, i]) for name, h in heads.items()}
        ref = torch.stack([full_attention(q[j, i], k[j, :i + 1], v[j, :i + 1], d ** -0.5) for j in range(H)])
        assert (outs["full"][0] - ref).abs().max() < 1e-12
        # PWL with exact intervals: the PWL softmax, computed directly
        s = (k[:, :i + 1].double() @ q[:, i].double().unsqueeze(-1)).squeeze(-1) * d ** -0.5
        p = heads["pwl"].cfg.pwl.exp(s - s.max(-1, keepdim=True).values)
        pwl_ref = (p.unsqueeze(1) @ v[:, :i + 1].double()).squeeze(1) / p.sum(-1, keepdim=True)
        assert (outs["pwl"][0] - pwl_ref).abs().max() < 1e-9
        for key in totals:
            totals[key] += outs["lad"][1][key]
        o1, _ = one.step(q[1, i], k[1, i], v[1, i])                 # heads are independent
        assert (o1 - outs["lad"][0][1]).abs().max() < 1e-12
    lad = heads["lad"]
    # cache invariant: A..F equal the sums over absorbed positions of their mode coefficients
    na = lad.absorbed
    a, b = lad.a[lad.mode], lad.b[lad.mode]
    K, V = lad.K[:, :na], lad.V[:, :na]
    assert na == n - (exact_recent - 1)
    assert torch.allclose(lad.A, (K * a.unsqueeze(-1)).transpose(1, 2) @ V, atol=1e-9)
    assert torch.allclose(lad.B, (a.unsqueeze(1) @ V).squeeze(1), atol=1e-9)
    assert torch.allclose(lad.C, (b.unsqueeze(1) @ V).squeeze(1), atol=1e-9)
    assert torch.allclose(lad.D, (a.unsqueeze(1) @ K).squeeze(1), atol=1e-9)
    assert torch.allclose(lad.E, a.sum(-1)) and torch.allclose(lad.F, b.sum(-1))
    assert int(lad._counters[:, :na].max()) <= lad.cfg.counter_max
    # keys along 6 directions: few centers; the approximation is exercised
    assert int(lad.n_centers.max()) < n // 3
    assert totals["active"] > 0 and totals["mode_changes"] > 0 and totals["candidates"] > totals["active"] // 2


@pytest.mark.parametrize("rule", ["join", "exact"])
def test_lad_bounded_center_table_rules(rule):
    """A full center table: 'join' gives every key a center (its best, whatever the cosine);
    'exact' leaves a key that matches none without a center, a candidate at every step, never missed."""
    q, k, v = _lad_data(SEED + 7)
    H, n, d = k.shape
    k = k + 0.5 * torch.randn(H, n, d, generator=torch.Generator().manual_seed(SEED))  # spread directions
    head = LadHead(LadConfig(head_dim=d, max_centers=4, full_table=rule), H)
    cand = 0
    for i in range(n):
        uncentered_absorbed = int(head._uncentered[:, :head.absorbed].sum())
        o, st = head.step(q[:, i], k[:, i], v[:, i])
        assert torch.isfinite(o).all()
        assert st["candidates"] >= uncentered_absorbed
        cand += st["candidates"]
    assert int(head.n_centers.max()) == 4
    unc = head._uncentered[:, :n]
    if rule == "join":
        assert not bool(unc.any()) and (head.ratio != 0).all()
    else:
        assert int(unc.sum()) > n                                  # most keys find no center at cos 0.98
        assert bool((head.ratio[unc] == 0).all()) and bool((head.ratio[~unc] != 0).all())
    assert cand > 0
    with pytest.raises(ConfigError, match="full_table"):
        LadConfig(full_table="drop")


# -- inside SmolLM2 ---------------------------------------------------------------------------------
def test_disabled_approximations_equal_full_attention(smollm2):
    from golden.llm.runs import teacher_forced
    ctl, ids = smollm2
    seq = ids[:29]
    _, ref, _ = teacher_forced(ctl, seq, "full", context=8, keep_logits=True, progress=False)
    assert ref.std() > 1.0 and ref.shape == (20, ctl.model.config.vocab_size)
    _, lad, st = teacher_forced(ctl, seq, "lad", context=8, lad=LadConfig(**FULL_ATTENTION),
                                keep_logits=True, progress=False)
    assert (lad - ref).abs().max() < 2e-3
    assert st["layer_steps"] == 20 * 30
    small = dict(min_context=16, window=16, band=8, sinks=0, full_layers="")
    _, mac, st = teacher_forced(ctl, seq, "mac", context=8, mac=MacConfig(exact_prefix=True, **small),
                                keep_logits=True, progress=False)
    assert (mac - ref).abs().max() < 2e-3
    assert st["hit_rate"] > 0.2 and st["skip_ratio"] > 0.05    # the hit path (merges) really ran
    _, mac, st = teacher_forced(ctl, seq, "mac", context=8, mac=MacConfig(reuse=False, **small),
                                keep_logits=True, progress=False)
    assert (mac - ref).abs().max() < 2e-3 and st["skip_ratio"] == 0.0
    # and with reuse on, the output really changes (the test could fail)
    _, mac, st = teacher_forced(ctl, seq, "mac", context=8, mac=MacConfig(**small), keep_logits=True,
                                progress=False)
    assert (mac - ref).abs().max() > 1e-2 and st["hit_rate"] > 0.2
    # full_layers: those layers' steps all miss, the others still hit
    _, _, st = teacher_forced(ctl, seq, "mac", context=8, mac=MacConfig(**{**small, "full_layers": "0,2-29"}),
                              progress=False)
    hits = {layer: sum(step["layers"][layer]["hits"] for step in ctl.layer_steps) for layer in range(30)}
    assert hits[1] > 0 and all(hits[layer] == 0 for layer in hits if layer != 1), hits


def test_lad_perplexity_within_1pct_on_512_tokens(smollm2):
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, teacher_forced
    ctl, ids = smollm2
    seq = ids[:513]
    nll_full, _ = full_parallel(ctl, seq)
    nll_lad, _, st = teacher_forced(ctl, seq, "lad", progress=False)
    assert len(nll_lad) == len(nll_full) == 512
    p_full, p_lad = perplexity(nll_full), perplexity(nll_lad)
    assert 5 < p_full < 200                                          # sane baseline
    assert abs(p_lad / p_full - 1) < 0.01, (p_full, p_lad, st)
    assert 0 < st["active_pct"] < 100 and st["keys_read_pct"] < 100 and st["mode_changes_pct"] > 0
    assert nll_lad != nll_full                                       # the approximation ran


def test_lad_tile_bit_accurate_model_inside_smollm2(smollm2):
    """The hardware's numerics on the real model: every head of every layer runs the tile's
    bit-accurate model (bit-exact with the RTL), after a prompt the tile decodes itself."""
    from golden.lad_tile import LadTileConfig
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, teacher_forced
    ctl, ids = smollm2
    context, tokens = 8, 40
    seq = ids[:context + tokens + 1]
    tile = LadTileConfig()
    nll_full, _ = full_parallel(ctl, seq, context)
    nll_twin, _, _ = teacher_forced(ctl, seq, "lad", context, lad=tile.reference(), progress=False)
    nll_tile, logits, st = teacher_forced(ctl, seq, "lad-tile", context, tile=tile, keep_logits=True,
                                          progress=False)
    assert len(nll_tile) == len(nll_full) == tokens and logits.std() > 1.0
    p_full, p_twin, p_tile = perplexity(nll_full), perplexity(nll_twin), perplexity(nll_tile)
    # the integer datapath costs < 1% over its float twin (measured +0.36% here, -0.1% at 96 tokens);
    # LAD's own approximation on 40 tokens is noisier (+1.8%; the 1% bound is on 512 tokens, above)
    assert abs(p_tile / p_twin - 1) < 0.01 and abs(p_tile / p_full - 1) < 0.05, (p_full, p_twin, p_tile, st)
    assert nll_tile != nll_twin and nll_tile != nll_full          # the integer datapath really ran
    assert st["positions_at_end"] == context + tokens and st["layer_steps"] == tokens * 30
    assert st["saturated_elements"] == 0                           # q, k, v fit the kv format
    assert 0 < st["active_pct"] < 100 and st["keys_read_pct"] < 100 and st["mode_changes_pct"] > 0
    assert 0 < st["cycles_last512_pct"] < 1000                    # the schedule model's cycles were counted
    # the activity record (`eval --activity`) holds these very counts, per layer and window of steps
    from golden.llm.activity import activity
    rec = activity(ctl.layer_steps, 16, engine="lad-tile")
    assert [(w["first_context"], w["last_context"], w["steps"]) for w in rec["windows"]] == \
        [(9, 24, 16), (25, 40, 16), (41, 48, 8)]
    assert all(len(w["layers"]) == 30 for w in rec["windows"])
    for key in ("candidates", "active", "mode_changes", "kv_beats"):                # counts: exact
        assert sum(layer[key] for w in rec["windows"] for layer in w["layers"]) == ctl.totals[key] > 0, key
    for key in ("tile_cycles", "dense_cycles"):                                      # the schedule's floats
        assert sum(layer[key] for w in rec["windows"] for layer in w["layers"]) == pytest.approx(ctl.totals[key])
        assert ctl.totals[key] > 0


def test_mac_engaged_at_2048_with_perplexity_within_2pct(smollm2):
    from golden.llm.metrics import perplexity
    from golden.llm.runs import full_parallel, teacher_forced
    ctl, ids = smollm2
    seq = ids[:2048 + 48 + 1]
    nll_full, _ = full_parallel(ctl, seq, context=2048)
    nll_mac, _, st = teacher_forced(ctl, seq, "mac", context=2048, progress=False)
    assert len(nll_mac) == len(nll_full) == 48
    p_full, p_mac = perplexity(nll_full), perplexity(nll_mac)
    assert st["engaged_steps"] == 48 and st["hit_rate"] > 0 and st["skip_ratio"] > 0
    assert abs(p_mac / p_full - 1) < 0.02, (p_full, p_mac, st)
    assert nll_mac != nll_full


def test_rouge_l():
    from golden.llm.metrics import lcs_length, rouge_l
    assert lcs_length([1, 2, 3, 4], [2, 4, 3]) == 2
    assert rouge_l([1, 2, 3], [1, 2, 3]) == 1.0
    assert rouge_l([1, 2, 3], [4, 5]) == 0.0
    assert rouge_l([1, 2, 3, 4], [1, 3]) == pytest.approx(2 * 0.5 * 1.0 / 1.5)


# -- `ladmac eval lad|mac` bad input: exit 2, one line, before the model is loaded -----------------
@pytest.fixture
def data_files(tmp_path):
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    nuls = tmp_path / "nuls.txt"
    nuls.write_text("word " * 200 + "\x00" * 64)
    short = tmp_path / "short.txt"
    short.write_text("only a few words here\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"missing": tmp_path / "missing.txt", "binary": binary, "nuls": nuls, "short": short,
            "folder": folder}


@pytest.mark.parametrize("method, argv, fragment", [
    ("lad", ["--model", "gpt2"], "unknown model 'gpt2'"),
    ("mac", ["--model", "llama"], "unknown model 'llama'"),
    ("lad", ["--data", "{missing}"], "WikiText-2 file not found"),
    ("mac", ["--data", "{binary}"], "is not UTF-8 text"),
    ("lad", ["--data", "{nuls}"], "is malformed"),
    ("lad", ["--data", "{short}"], "is malformed"),
    ("mac", ["--data", "{folder}"], "is not a regular file"),
    ("lad", ["--set", "bogus=1"], "unknown parameter 'bogus'"),
    ("lad", ["--set", "center_cos"], "NAME=VALUE"),
    ("lad", ["--set", "center_cos=2"], "center_cos must be in (0, 1]"),
    ("lad", ["--set", "pwl_cutoff=-inf"], "must be finite"),
    ("lad", ["--set", "pwl_cutoff=-1e-300"], "no usable PWL table"),
    ("lad", ["--set", "head_dim=32"], "set from the model"),
    ("mac", ["--set", "tau=abc"], "expects float"),
    ("mac", ["--set", "window=0"], "window must be >= 1"),
    ("lad", ["--tokens", "0"], "--tokens must be positive"),
    ("lad", ["--threads", "-1"], "--threads must be >= 0"),
    ("mac", ["--offset", "-1"], "--offset must be >= 0"),
    ("lad", ["--set", "vpus=5"], "unknown parameter 'vpus' for LadConfig"),
    ("lad", ["--hardware", "--set", "exact_scores=true"], "unknown parameter 'exact_scores' for LadTileConfig"),
    ("lad", ["--hardware", "--set", "lanes=7"], "must be a multiple of lanes"),
    ("lad", ["--hardware", "--set", "head_dim=32", "--set", "lanes=8", "--set", "vpus=5"], "head_dim is 64"),
    ("lad", ["--hardware", "--set", "max_positions=256", "--set", "max_centers=256", "--set", "kv_positions=256",
             "--tokens", "300"], "exceeds the tile's KV memory"),
    ("lad", ["--hardware", "--set", "max_positions=256"], "max_centers must be 1..max_positions"),
    ("lad", ["--tile-set", "vpus=5"], "unrecognized arguments: --tile-set"),
    ("lad", ["--variants", "lad-tile"], "not among this run's variants (lad)"),
    ("lad", ["--hardware", "--variants", "lad,bogus"], "'bogus' is not among"),
    ("mac", ["--context", "8192"], "max_position_embeddings 8192"),
    ("mac", ["--context", "8000", "--tokens", "192"], "needs 8193 positions"),
    ("lad", ["--tokens", "9000"], "max_position_embeddings 8192"),
    ("mac", ["--prompt-len", "8190", "--new-tokens", "8"], "max_position_embeddings 8192"),
    ("mac", ["--hardware", "--set", "band=-1"], "band must be >= 0"),
    ("mac", ["--hardware", "--set", "max_positions=1024"], "exceeds the engine's KV memory"),
    ("mac", ["--frobnicate"], "unrecognized arguments"),
    ("lad", ["--out", "{folder}"], "is a directory"),
    ("lad", ["--plot", "{binary}"], "is not a folder"),
    ("lad", ["--activity", "a.json"], "--activity records an engine's bit-accurate model: it needs --hardware"),
    ("mac", ["--hardware", "--variants", "mac", "--activity", "a.json"], "it needs --hardware"),
    ("lad", ["--hardware", "--activity", "{folder}"], "--activity {folder} is a directory"),
    ("mac", ["--hardware", "--activity", "a.json", "--activity-window", "0"], "--activity-window must be positive"),
])
def test_eval_bad_input_exits_2_with_one_line(method, argv, fragment, data_files, monkeypatch, capsys):
    import golden.llm.decode_eval as de
    from ladmac_cli import main

    def no_model(*a, **k):
        raise AssertionError("bad input must be rejected before the model is loaded")
    monkeypatch.setattr(de, "load_model", no_model)
    argv = [a.format(**data_files) for a in argv]
    try:
        code = main(["eval", method, *argv, "--no-progress"])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment.format(**data_files) in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("ladmac: error: ")


def test_eval_set_edits_the_method_config(monkeypatch):
    """``--set`` edits LadConfig (eval lad), LadTileConfig (eval lad --hardware; the float twin is
    its reference()) or MacConfig (eval mac), starting from the config's own defaults."""
    from golden.lad_tile import LadTileConfig
    from golden.llm.decode_eval import build_parser, method_configs

    def configs(method, argv):
        return method_configs(method, build_parser(method).parse_args(argv))
    assert configs("lad", []) == (LadConfig(), None)
    assert configs("lad", ["--set", "center_cos=0.9", "--set", "max_centers=32"]) == \
        (LadConfig(center_cos=0.9, max_centers=32), None)
    assert configs("lad", ["--hardware", "--set", "max_centers=128"]) == \
        (LadConfig(), LadTileConfig(max_centers=128))
    twin = LadTileConfig().reference()                                  # the float twin follows the tile
    assert (twin.pwl_intervals, twin.pwl_cutoff, twin.max_centers) == (8, -6.0, 4096)
    assert configs("mac", ["--set", "window=64", "--set", "reuse=false"]) == (MacConfig(window=64, reuse=False), None)
    assert configs("mac", []) == (MacConfig(), None)
    from golden.mac_decode import MacDecodeConfig
    assert configs("mac", ["--hardware", "--set", "band=32"]) == \
        (MacDecodeConfig(band=32).reference(), MacDecodeConfig(band=32))
    assert MacDecodeConfig().reference() == MacConfig()             # the float twin of the defaults


def test_max_positions_read_without_loading_the_model():
    from golden.llm.runs import max_positions
    from golden.llm.smollm2 import max_position_embeddings
    assert max_positions() == max_position_embeddings() == 8192      # SmolLM2-135M's 8k context
    with pytest.raises(ConfigError, match="unknown model"):
        max_positions("gpt2")


def test_read_wikitext_accepts_text_and_names_the_file(tmp_path):
    from golden.errors import DataError
    from golden.llm.data import read_wikitext
    good = tmp_path / "test.txt"
    good.write_text(" = Title = \n" + "the quick brown fox jumps . " * 40)
    assert read_wikitext(good).startswith(" = Title")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 200)
    with pytest.raises(DataError, match="latin1.txt is not UTF-8"):
        read_wikitext(bad)


def test_eval_console_exit_code_without_traceback(tmp_path):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "ladmac_cli", "eval", "mac", "--data", str(tmp_path / "none.txt")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"ladmac: error: WikiText-2 file not found: {tmp_path / 'none.txt'}"]


def test_read_activity_refuses_what_is_not_a_record(tmp_path):
    from golden.errors import DataError
    from golden.llm.activity import activity, read_activity
    with pytest.raises(DataError, match="no activity record"):
        read_activity(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="is not an activity record"):
        read_activity(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": 1, "windows": []}')
    with pytest.raises(DataError, match="of format 1"):
        read_activity(tmp_path / "other.json")
    steps = [{"context": 5 + i, "layers": {0: {"hits": i, "cycles": 1.5}, 1: {"hits": 1, "cycles": 2.0}}}
             for i in range(3)]
    (tmp_path / "good.json").write_text(json.dumps(activity(steps, 2, engine="mac-decode")))
    rec = read_activity(tmp_path / "good.json")
    assert [(w["first_context"], w["steps"]) for w in rec["windows"]] == [(5, 2), (7, 1)]
    assert rec["windows"][0]["layers"] == [{"hits": 1, "cycles": 3.0}, {"hits": 2, "cycles": 4.0}]
