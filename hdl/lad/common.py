"""Layouts and small datapath pieces shared by the LAD tile's modules (golden/lad_tile.py).

``boundary_tests`` / ``interval_count`` the SFM's interval compare (docs/algorithms.md §1.1), ``bump_terms`` / ``bumped_counters`` the
saturating mode counters of §1.4 (``golden.lad_tile.bump_counters``), ``score_of`` the
scaled score of a dot product (``LadTileModel.score``).
"""
from __future__ import annotations

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, enum, memory, stream

from golden.errors import ConfigError
from golden.lad_tile import LadTileConfig, mode_bounds
from golden.sram import SramConfig

from ..lib.arith import round_shift, saturate


class Wires(SimpleNamespace):
    """The signals (and parts) one piece of a block's hardware hands to the pieces built after it
    (an ``elaborate`` split into sub-builders: each takes what it reads from here, ``add``s what it makes)."""

    def add(self, **signals):
        self.__dict__.update(signals)


def coef_width(cfg: LadTileConfig) -> int:
    """Signed bits of MD's ``alpha = a_r - a_mode`` and ``beta = b_r - b_mode``: differences of two
    entries of EXP's slope or intercept table, which are all >= 0 (chords of exp), so ``|alpha|``,
    ``|beta|`` are at most the largest entry (17 bits at the defaults' largest, 61501 at frac 16)."""
    tables = list(cfg.sfm.exp_slopes_raw) + list(cfg.sfm.exp_intercepts_raw)
    assert min(tables) >= 0, "EXP's PWL tables are non-negative"
    return max(tables).bit_length() + 1


def w_width(cfg: LadTileConfig) -> int:
    """Signed bits of a correction weight ``w = round_shift(alpha x + (beta << x_frac), exp_shift)``
    (frac 15) for any x of the score format: ``|alpha|, |beta| < 2^(coef_width - 1)``, ``|x| <= 2^(x_width - 1)``."""
    return coef_width(cfg) + cfg.sfm.x_width - cfg.sfm.exp_shift + 1


def beat_layout(cfg: LadTileConfig) -> data.ArrayLayout:
    """One beat of q, k, v or o: ``lanes`` signed kv-format elements."""
    return data.ArrayLayout(signed(cfg.kv_width), cfg.lanes)


def beat_load_layout(cfg: LadTileConfig) -> data.StructLayout:
    """One beat of the step's q (or k_n) as the tile broadcasts it while it loads the step."""
    return data.StructLayout({"beat": range(cfg.beats), "data": beat_layout(cfg)})


def beat_load_signature(cfg: LadTileConfig) -> stream.Signature:
    """A module's ``q_load`` / ``k_load`` port: every beat is taken (always ready)."""
    return stream.Signature(beat_load_layout(cfg), always_ready=True)


def query_load_layout(cfg: LadTileConfig) -> data.StructLayout:
    """A beat of one of the step's ``group`` queries: :func:`beat_load_layout`, with the query head
    it belongs to when ``group`` > 1."""
    if cfg.group == 1:
        return beat_load_layout(cfg)
    return data.StructLayout({**{name: f.shape for name, f in beat_load_layout(cfg)}, "head": range(cfg.group)})


def query_load_signature(cfg: LadTileConfig) -> stream.Signature:
    """A ``q_load`` port that takes a group's queries (always ready)."""
    return stream.Signature(query_load_layout(cfg), always_ready=True)


def per_head(cfg: LadTileConfig, shape):
    """``shape`` at group 1, else an array of one per query head of the group."""
    return shape if cfg.group == 1 else data.ArrayLayout(shape, cfg.group)


def head_scores_shape(cfg: LadTileConfig):
    """A score per query head of the group (:func:`per_head` of ``signed(x_width)``)."""
    return per_head(cfg, signed(cfg.sfm.x_width))


def head_values(cfg: LadTileConfig, value) -> list:
    """A :func:`per_head` value as a list of one value per query head."""
    return [value] if cfg.group == 1 else [value[h] for h in range(cfg.group)]


def beat_copy(m, cfg: LadTileConfig, load, name: str, lanes: int, reads: int) -> list:
    """A module's own copy of the step's q (or k_n), ``lanes`` elements a word: a small LUT RAM
    written from ``load``'s beats (``cfg.lanes`` elements each; a word of r = lanes / cfg.lanes beats
    is written a beat at a time through r write lanes) and read combinationally by ``reads`` ports
    (set each port's ``addr``, the word index; read its ``data``, element 0 in the low bits).

    Each module keeps its copy beside the logic that reads it, so the step's beats (not whole
    head_dim vectors, 1,024 bits at d = 64) cross the tile (docs/lad-tile.md "Synthesis": the
    vectors and their beat selects were the tile's densest routing on the ECP5). Written and read
    as the registers it replaces were: a beat written in one cycle is read from the next."""
    r, beat_bits = lanes // cfg.lanes, cfg.lanes * cfg.kv_width
    mem = memory.Memory(shape=unsigned(lanes * cfg.kv_width), depth=cfg.head_dim // lanes, init=[])
    m.submodules[name] = mem
    write = mem.write_port(granularity=beat_bits)
    beat = load.payload.beat
    m.d.comb += [write.addr.eq(beat // r if r > 1 else beat), write.data.eq(load.payload.data.as_value().replicate(r)),
                 write.en.eq(Mux(load.valid, Const(1, r) << (beat % r) if r > 1 else 1, 0))]
    return [mem.read_port(domain="comb") for _ in range(reads)]


def centers_layout(cfg: LadTileConfig) -> data.StructLayout:
    """A position's center and rho (APID's ``apid.centers``: the keys' alone, one copy for a group)."""
    return data.StructLayout({"center": unsigned(cfg.center_width), "rho": signed(cfg.rho_width)})


def mode_layout(cfg: LadTileConfig) -> data.StructLayout:
    """A position's mode and counters for one query head (APID's ``apid.modes<h>``)."""
    return data.StructLayout({
        "mode": unsigned(cfg.sfm.interval_width),
        "counters": data.ArrayLayout(unsigned(cfg.counter_bits), cfg.n_intervals),
    })


def candidate_layout(cfg: LadTileConfig) -> data.StructLayout:
    """APID -> MD (a candidate) and MD -> APID (its verdict: new mode and counters)."""
    return data.StructLayout({
        "position": unsigned(cfg.position_width),
        "mode": unsigned(cfg.sfm.interval_width),
        "counters": data.ArrayLayout(unsigned(cfg.counter_bits), cfg.n_intervals),
    })


def recip_resp_layout(cfg: LadTileConfig) -> data.StructLayout:
    """An SFM RECIP result: 1/z = mantissa * 2**-(mantissa_frac + exponent)."""
    return data.StructLayout({"mantissa": unsigned(cfg.sfm.mantissa_frac + 1),
                              "exponent": unsigned(cfg.sfm.exponent_width)})


def require_one_head(cfg: LadTileConfig) -> LadTileConfig:
    """MD and AC serve one query head (a tile per KV group has one of each per head, built at
    ``group`` 1). Raises ConfigError (one line) for ``group > 1``; returns ``cfg``."""
    if cfg.group != 1:
        raise ConfigError(f"MD and AC serve one query head (a tile per KV group has one per head); group "
                          f"{cfg.group} is for lad-tile, lad-eas and lad-apid")
    return cfg


def sram_banks(cfg: LadTileConfig) -> dict[str, SramConfig]:
    """Every SRAM bank of the tile, by module: the one sizing that the modules build and that
    reports (``sram_bits``, docs/lad-tile.md's SRAM map, design sweeps) count.

    EAS: centers (``eas_beats`` words of ``eas_lanes`` elements per center, ``center_bits`` each,
    plus the center's exponent), their scores q.c_j and 1/|c_j|^2; APID: each position's center and
    rho, its mode and counters (a bank per head) and approximate score; AC: cache A, row ``l`` in bank
    ``l mod (vpus - 3)``, one word per beat of ``ac_acc_width``-bit lanes. A tile serving a group
    of ``group`` query heads keeps one center table, its recips and each position's center and rho
    for all of them; per head: the center scores, modes and counters, approximate scores, cache A
    and the exact pass's scores (one word holds every head's entry at an address, the modes a bank
    per head as the heads write them apart, the A banks one head's rows after another)."""
    L, nb, d, P, g = cfg.lanes, cfg.beats, cfg.head_dim, cfg.ac_vpus, cfg.group
    xw = cfg.sfm.x_width
    a_words = max(2, d // P * nb) * g
    return {
        # EAS's banks: registered reads (the block RAM's output register); the centers (up to 128
        # DP16KD across the device) with their read address from a register and their bank mux
        # as a registered tree of three stages (2:1 each at 8 banks: each stage's mux can sit
        # between its two sources; with two stages, 4:1 then 2:1, the RAMs' outputs crossed the
        # device to the first: 7.9 ns, lad-eas's 102.4 MHz); the scores and recips with their
        # read address from a register too (EAS's FSM is far from them), the recips' word
        # registered once more (its DP16KD -> the output FIFO's LUT RAM was 7.9 ns of routing,
        # lad-eas's 109.8 MHz), hdl/lib/sram.py
        "eas.centers": SramConfig(depth=max(2, cfg.max_centers * cfg.eas_beats),
                                  width=cfg.eas_lanes * cfg.center_element_bits + cfg.center_exp_width,
                                  read_latency=6, address_register=True),
        "eas.center_scores": SramConfig(depth=max(2, cfg.max_centers), width=xw * g, read_latency=4,
                                        address_register=True),
        "eas.center_recips": SramConfig(depth=max(2, cfg.max_centers), width=recip_resp_layout(cfg).size,
                                        read_latency=5, address_register=True),
        # APID's banks: read data registered once more after the RAM (APID's register slices
        # take it from a fabric register next to the RAM, not from the RAM's output pins)
        "apid.centers": SramConfig(depth=cfg.max_positions, width=centers_layout(cfg).size, read_latency=2),
        **{f"apid.modes{h}": SramConfig(depth=cfg.max_positions, width=mode_layout(cfg).size, read_latency=2)
           for h in range(g)},
        "apid.approx_scores": SramConfig(depth=cfg.max_positions, width=xw * g, read_latency=2),
        # AC's cache A: the tiles' data registered (the DP16KD's output register), then the bank's
        # word (its bank / read-during-write mux) registered, before AC's rounding carry chain
        **{f"ac.a{p}": SramConfig(depth=a_words, width=L * cfg.ac_acc_width, read_latency=3) for p in range(P)},
        "exact.scores": SramConfig(depth=cfg.kv_positions, width=xw * g, read_latency=1),   # the exact pass's scores
    }


def sram_bits(cfg: LadTileConfig) -> int:
    """Total SRAM bits of the tile (all banks of :func:`sram_banks`)."""
    return sum(bank.depth * bank.width for bank in sram_banks(cfg).values())


def sram_bits_per_head(cfg: LadTileConfig) -> float:
    """The tile's SRAM bits per query head it serves (``sram_bits / group``)."""
    return sram_bits(cfg) / cfg.group


def ac_command_layout(cfg: LadTileConfig) -> data.StructLayout:
    """Commands of AC. ``TERMS`` (with ``m``): N and Z from the caches; ``BEATS`` (``beats``
    items, one beat of k and v each): ``accumulate`` adds ``w v`` to N and ``w`` to Z,
    ``update`` adds ``(alpha, beta, k, v)`` to caches A-F; ``FINISH``: o = N RECIP(Z) on ``out``."""
    xw = cfg.sfm.x_width
    return data.StructLayout({
        "op": AcOp,
        "m": signed(xw),
        "w": signed(w_width(cfg)),
        "alpha": signed(coef_width(cfg)),
        "beta": signed(coef_width(cfg)),
        "accumulate": unsigned(1),
        "update": unsigned(1),
        "k": beat_layout(cfg),
        "v": beat_layout(cfg),
    })


class AcOp(enum.IntEnum, shape=2):
    """AC command (docs/lad-tile.md): cache terms, one beat of k and v, finish o = N / Z, or the
    q.A pass ahead of TERMS."""
    TERMS = 0
    BEATS = 1
    FINISH = 2
    QA = 3


def boundary_tests(x, cfg: LadTileConfig):
    """``x < e_k`` for every boundary ``e_k`` of the SFM's intervals (a register may follow)."""
    return Cat(*(x < e for e in cfg.sfm.exp_boundaries_raw))


def interval_count(tests):
    """The interval index from ``boundary_tests``: how many boundaries lie above x."""
    return sum(tests[k] for k in range(len(tests)))


def score_of(dot, cfg: LadTileConfig):
    """The scaled exact score of a q.k dot product, in the SFM's x format."""
    return saturate(round_shift(dot * cfg.scale_raw, cfg.score_shift), signed(cfg.sfm.x_width))


def mode_thresholds(m, m_load, load, cfg: LadTileConfig):
    """APID's test without the subtraction: ``x^ = sat(s^ - m)`` is outside the (guarded) bounds
    ``lo``, ``hi`` of interval ``mode`` iff ``s^ < lo + m`` or ``s^ >= hi + m``, because ``sat`` is
    monotone and exact inside the x format (a bound at or past the format's end can never be
    crossed by a saturated ``x^``: that side is dropped). The per-interval thresholds are
    registers, loaded from ``m_load`` when ``load``. Returns ``(compare, pick)``:
    ``compare(s_hat)`` is every interval's two tests (2 x n_intervals bits, in parallel) and
    ``pick(tests, mode)`` the verdict for ``mode`` from them (a register may sit between)."""
    lo, hi = mode_bounds(cfg)
    fmt = cfg.sfm.x_format
    tw = cfg.sfm.x_width + 2
    R = cfg.n_intervals
    sides = []
    for name, bounds, crossable in (("lo", lo, lambda b: b > fmt.min_raw), ("hi", hi, lambda b: b <= fmt.max_raw)):
        regs = [Signal(signed(tw), name=f"threshold_{name}{r}") for r in range(R)]
        with m.If(load):
            m.d.sync += [reg.eq(m_load + (b if b is not None else 0)) for reg, b in zip(regs, bounds)]
        sides.append((regs, Array(Const(b is not None and crossable(b), 1) for b in bounds)))
    (t_lo, has_lo), (t_hi, has_hi) = sides

    def compare(s_hat):
        return Cat(*(s_hat < t for t in t_lo), *(s_hat >= t for t in t_hi))

    def pick(tests, mode):
        below, above = Array(tests[r] for r in range(R)), Array(tests[R + r] for r in range(R))
        return (has_lo[mode] & below[mode]) | (has_hi[mode] & above[mode])
    return compare, pick


def bump_terms_width(cfg: LadTileConfig) -> int:
    """Bits of ``bump_terms``: every counter plus one bit, and the overflow flag."""
    return cfg.n_intervals * (cfg.counter_bits + 1) + 1


def bump_terms(counters, r, cfg: LadTileConfig) -> Value:
    """The two parts of bumping counter ``r``: every counter plus (its index == r), and whether
    counter ``r`` overflows (it is at counter_max now: no add in series). A register may sit
    between this and ``bumped_counters``, so neither the counters' look-up by ``r`` nor the adds
    meet the halving mux and what reads the result in one cycle. Each counter's increment is made
    from the counters alone and ``r`` only chooses it (``r``, read from MD's score FIFO, ran
    through the increments' carry chains: lad-md's critical path, 120.5 MHz, seed 1)."""
    plus = [Mux(r == i, counters[i] + 1, counters[i]) for i in range(cfg.n_intervals)]
    over = Array(counters[i] for i in range(cfg.n_intervals))[r] == cfg.counter_max
    return Cat(*(p[:cfg.counter_bits + 1] for p in plus), over)


def bumped_counters(m, terms, cfg: LadTileConfig, name: str):
    """Counters (an ArrayLayout view) with counter ``r`` plus one, all halved if it overflowed,
    from ``bump_terms``; a new Signal driven combinationally in module ``m``."""
    layout = data.ArrayLayout(unsigned(cfg.counter_bits), cfg.n_intervals)
    out = Signal(layout, name=name)
    w = cfg.counter_bits + 1
    over = terms[w * cfg.n_intervals]
    for i in range(cfg.n_intervals):
        plus = terms[w * i:w * (i + 1)]
        m.d.comb += out[i].eq(Mux(over, plus >> 1, plus))
    return out
