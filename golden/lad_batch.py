"""Fast bit-accurate LAD tile model: ``H`` heads advanced together as integer tensors.

``LadTileBatch(cfg, heads).step(q, k, v)`` with raw kv-format ``(H, d)`` int64 tensors returns
``o (H, d)`` and the statistics of ``LadTileModel.step`` (same keys, each an ``(H,)`` int64
tensor), bit-exact with ``H`` independent ``golden.lad_tile.LadTileModel``s fed one row each
(testbenches/test_lad_batch.py checks it on a real SmolLM2 trace, on random sequences that
fill the center table, saturate and overflow, and on all-active / zero-interval corners).
It follows the steps of golden/lad_tile.py's docstring; only the evaluation order differs.

Vectorization
-------------
All heads hold the same number of positions ``n`` (they step together), so the state is
the per-head model's state with a leading head axis: ``KV (H, P, 2d)`` (k | v of each
position, int16: kv_width <= 16), ``centers (H, max_centers, d)`` (float64, integer-valued),
``center_of, rho, mode (H, P)``, the APID bounds of each position's mode ``mlo, mhi (H, P)``,
``counters (H, P, R+1)`` (int16), caches ``A (H, d, d)``, ``BCD (H, 3, d)``, ``EF (H, 2)``
(int64). Dot products of kv-format vectors are int32 products (``|q k| <= 2**30``) summed
in int64, or, where one vector meets many (center scores, the exact pass), float64 matrix
products (``exact_bmm``): every product and partial sum is an integer below ``2**53`` in
magnitude, so each float64 operation is exact whatever the summation order.

- EAS: ``c.q`` and ``c.k`` for every center slot of every head in one product
  (``(H, C, 2)``, ``exact_bmm``); first argmax of ``t`` over the valid slots (invalid ones get ``t = -1``),
  the join rule and the new-center writes as masked tensor updates.
- Exact pass past ``max_positions``: the dense baseline for every head at once over a float64
  copy of the KV memory (scores and ``sum p v`` by ``exact_bmm``).
- s^, m, APID: ``(H, n)`` gathers and compares.
- MD: every candidate of every head is one row of a flat list (``cand.nonzero()``: head
  major, positions in increasing order, the per-head model's order), with its k | v row
  gathered once. Each candidate's decision depends only on its own position's state, so
  x, r, counters, change, alpha, beta, w are row-wise tensor ops; all counters (quiet: bump
  the mode, candidate: bump r) are bumped with one gather/scatter over ``(H, n)``, and the
  positions whose bumped counter passed the maximum are halved with one indexed copy.
- Saturating ordered sums: ``N += w_i v_i``, ``Z += w_i`` over the candidates (false alarms
  have ``w = 0``, a no-op) then ``p_new``; the caches over the mode changes then the
  absorption of the new position (two consecutive saturating sequences equal their
  concatenation). Per head the terms are a segment of the flat list (``Segments``).
  Fast path: ``max|start| + sum_i max|term_i| <= max_raw`` for a head means no partial sum
  can leave the range, so the result is the plain sum (per-head segment sums; for A one
  batched int64 matmul ``[G_h; g]^T [K_h; k]`` over rows padded per head). A head failing
  that bound gets the per-head model's exact rule (``sat_add_sequence``: partial sums by
  ``cumsum``; if any leaves the range, add-then-saturate term by term; only in saturation
  corners).

Products wider than 64 bits
---------------------------
The per-head model multiplies Python ints where products may exceed int64: ``S * q.A_r``,
``S * q.D_r``, ``m * B`` (B up to 62 bits), ``N * RECIP(Z)`` in FINISH and
``dot**2 * RECIP(|c|**2)`` in EAS. Here every one is exact in int64 (``round_shift`` is
round half up, ``floor((x + 2**(s-1)) / 2**s)``, golden/fixedpoint.py), by one of:

- Split and nested floors (``S q.A_r``, ``S q.D_r``, FINISH): for ``x = a b`` and a shift
  ``s >= L``, with ``a = ah 2**L + al`` (``al in [0, 2**L)``),
  ``floor((a b + h) / 2**s) = (ah b + ((al b + h) >> L)) >> (s - L)`` (``h = 2**(s-1)``):
  ``floor(floor(y / 2**L) / 2**(s-L)) = floor(y / 2**s)``. ``L = s`` for the cache terms,
  ``L = mantissa_frac`` in FINISH (``s = mantissa_frac + e``); every partial fits int64.
- Two limbs of base ``2**31`` (``m B``): ``mul_wide(a, b)`` (``|a| < 2**62``, ``|b| < 2**31``)
  splits ``a = a1 2**31 + a0`` (``a0 in [0, 2**31)``) and returns ``(hi, lo)`` with
  ``a b = hi 2**31 + lo``, ``lo in [0, 2**31)``; ``round_shift_wide(hi, lo, s)`` adds the half
  LSB into the limb it falls in (with the carry), then ``floor(x / 2**s) = hi >> (s - 31)``
  for ``s >= 31`` and ``(hi << (31 - s)) + (lo >> s)`` for ``s < 31``. The result is exact
  within ``+-2**62`` and clamped to ``+-2**62`` beyond (``hi`` is clamped before the left
  shift so that the clamp is of the true value). In ``N = sat(T1 - T2 + T3)`` a clamped
  ``T2 = round_shift(m B, .)`` saturates N to the same side as the true value because
  ``|T1| + |T3| <= 2**62 - 2**61``.
- EAS ``t = round_shift(|dot| y, mf + e)`` with ``y = |dot| rc < 2**62``: ``|dot| y`` as two
  limbs (the low 31-bit limb of ``|dot|`` through ``mul_wide``, the high limb times ``y``
  added to ``hi``); since ``t <= 2 |k|**2 + 1`` (Cauchy-Schwarz, ``2**e <= |c|**2``,
  ``rc <= 2**(mf+1)``), ``t = ((hi << (31 - s1)) + ((lo + h) >> s1)) >> (s - s1)`` with
  ``s1 = min(s, 31)`` needs no clamp.

The constructor checks every bound these rely on (and that all other products and sums fit
int64, and every float64 product below ``2**53``) from the config's formats and raises
``ValueError`` for a config that would break one. Floats hold integers only.
"""
from __future__ import annotations

import torch

from .dense import score_from_dots
from .fixedpoint import FixedFormat, round_shift, saturate
from .sfm import exp_pwl, recip
from .lad_tile import COS_FRAC, LadTileConfig, StepPath, center_value, mode_bounds, sat_add_sequence

LIMB = 31
LOW = (1 << LIMB) - 1
EXACT_F64 = 1 << 53         # float64 holds every integer below this magnitude exactly
WIDE_LIM = 1 << 62          # round_shift_wide's results are exact up to this magnitude, clamped beyond
STAT_KEYS = ("position", "candidates", "active", "false_alarms", "mode_changes", "path", "m", "z",
             "centers", "new_center", "kv_beats",
             "group_candidates", "group_active")
# group_candidates / group_active: positions that are a candidate / active for any query head of the
# head's group (cfg.group consecutive heads share the keys): the keys / values a group's tile reads
# once for all its heads. With group 1 they equal candidates / active.


# -- exact wide arithmetic in int64 ---------------------------------------------------------------
def mul_wide(a: torch.Tensor, b) -> tuple[torch.Tensor, torch.Tensor]:
    """``a * b`` as ``hi * 2**31 + lo`` (``lo`` in ``[0, 2**31)``), exact for ``|a| < 2**62``, ``|b| < 2**31``."""
    a1, a0 = a >> LIMB, a & LOW
    p0 = a0 * b
    return a1 * b + (p0 >> LIMB), p0 & LOW


def exact_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of integer-valued float64 batches as int64, exact when ``sum |a_ij b_jk|`` stays
    below ``2**53`` (then no product or partial sum is ever rounded; the caller proves the bound)."""
    return torch.bmm(a, b).long()


def round_shift_wide(hi: torch.Tensor, lo: torch.Tensor, s) -> torch.Tensor:
    """``round_shift(hi * 2**31 + lo, s)`` for ``s >= 0`` (int or tensor), exact where the result
    is within ``+-2**62``, clamped to ``+-2**62`` otherwise. Needs ``|hi| < 2**62``."""
    if isinstance(s, int):
        if s <= LIMB:
            lo = lo + ((1 << s) >> 1)
            hi, lo = hi + (lo >> LIMB), lo & LOW
        else:
            hi = hi + (1 << (s - LIMB - 1))
        if s >= LIMB:
            return (hi >> (s - LIMB)).clamp(-WIDE_LIM, WIDE_LIM)
        hc = hi.clamp(-(1 << (LIMB + s)) - 1, 1 << (LIMB + s))
        return ((hc << (LIMB - s)) + (lo >> s)).clamp(-WIDE_LIM, WIDE_LIM)
    s = torch.as_tensor(s, dtype=torch.int64)
    # + half an LSB: into lo (s <= 31, carry into hi) or into hi (s >= 32)
    half_lo = torch.where(s <= LIMB, (torch.ones_like(s) << s.clamp(max=LIMB)) >> 1, torch.zeros_like(s))
    half_hi = torch.where(s > LIMB, torch.ones_like(s) << (s - LIMB - 1).clamp(0, 62), torch.zeros_like(s))
    lo = lo + half_lo
    hi = hi + (lo >> LIMB) + half_hi
    lo = lo & LOW
    big = hi >> (s - LIMB).clamp(0, 63)                               # s >= 31
    sl = s.clamp(max=LIMB)
    hc = torch.maximum(torch.minimum(hi, torch.ones_like(sl) << (LIMB + sl)), -(torch.ones_like(sl) << (LIMB + sl)) - 1)
    small = (hc << (LIMB - sl)) + (lo >> sl)                           # s < 31
    return torch.where(s >= LIMB, big, small).clamp(-WIDE_LIM, WIDE_LIM)


class Segments:
    """Rows of a flat list grouped by head: ``seg (M,)`` the head of each row, non-decreasing;
    ``ends`` the cumulative row counts (a list of H ints)."""

    def __init__(self, seg: torch.Tensor, heads: int):
        self.seg, self.heads = seg, heads
        self.ends = torch.bincount(seg, minlength=heads).cumsum(0).tolist()

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head sums of the rows of ``x (M, ...)`` -> ``(H, ...)``, exact."""
        if x.numel() < 16384:         # small: one scatter; large: contiguous slices are faster
            return torch.zeros((self.heads,) + x.shape[1:], dtype=x.dtype).index_add_(0, self.seg, x)
        out, lo = [], 0
        for e in self.ends:
            out.append(x[lo:e].sum(0))
            lo = e
        return torch.stack(out)

    def rows(self, h: int) -> slice:
        return slice(self.ends[h - 1] if h else 0, self.ends[h])


class LadTileBatch:
    """``heads`` LAD tiles stepping together; bit-exact with one ``LadTileModel`` per head.
    ``n``: positions so far (all heads), ``n_centers (H,)``; ``step(q, k, v)`` as documented above."""

    def __init__(self, cfg: LadTileConfig, heads: int):
        if cfg.kv_width > 16:
            raise ValueError("LadTileBatch stores q, k, v as int16 (kv_width <= 16)")
        if heads % cfg.group:
            raise ValueError(f"LadTileBatch: {heads} heads are not whole groups of {cfg.group}")
        self.cfg, self.heads = cfg, heads
        sfm = cfg.sfm
        H, d, P, R1 = heads, cfg.head_dim, cfg.max_positions, cfg.n_intervals
        i64 = dict(dtype=torch.int64)
        self.slopes = torch.tensor(sfm.exp_slopes_raw, **i64)
        self.intercepts = torch.tensor(sfm.exp_intercepts_raw, **i64)
        lo, hi = mode_bounds(cfg)
        big = 1 << 40
        self.lo = torch.tensor([v if v is not None else -big for v in lo], **i64)
        self.hi = torch.tensor([v if v is not None else big for v in hi], **i64)
        self.bounds_asc = torch.tensor(sorted(sfm.exp_boundaries_raw), **i64)
        self.n_bounds = len(sfm.exp_boundaries_raw)
        self.recip_c0 = torch.tensor(sfm.recip_c0_raw, **i64)
        self.recip_c1 = torch.tensor(sfm.recip_c1_raw, **i64)
        self.pow2 = torch.tensor([1 << i for i in range(63)], **i64)
        self.n = 0
        # main memory holds kv-format values as int16, the center table as integer-valued float64
        # (its scores are exact_bmm products)
        self.KV = torch.zeros(H, P, 2 * d, dtype=torch.int16)      # k | v of each position (LAD steps)
        self.KV_exact: torch.Tensor | None = None                  # (H, kv_positions, 2d) float64 (exact pass)
        self.centers = torch.zeros(H, cfg.max_centers, d, dtype=torch.float64)
        self.center_rm = torch.zeros(H, cfg.max_centers, **i64)   # RECIP(|c|^2): mantissa
        self.center_re = torch.zeros(H, cfg.max_centers, **i64)   # and exponent
        self.n_centers = torch.zeros(H, **i64)
        self.center_of = torch.zeros(H, P, **i64)
        self.rho = torch.zeros(H, P, **i64)
        self.mode = torch.zeros(H, P, **i64)
        self.mlo = torch.zeros(H, P, **i64)        # lo[mode], hi[mode] of each position (APID)
        self.mhi = torch.zeros(H, P, **i64)
        self.counters = torch.zeros(H, P, R1, dtype=torch.int16)
        self.A = torch.zeros(H, d, d, **i64)       # A[h][l][j]
        self.BCD = torch.zeros(H, 3, d, **i64)     # B, C, D (one saturating sequence: same format)
        self.EF = torch.zeros(H, 2, **i64)         # E, F
        self._heads = torch.arange(H)
        self.fallback = cfg.fallback()                             # the exact pass's dense config (kept: its tables)
        self._check_widths()

    K = property(lambda self: self.KV[:, :, :self.cfg.head_dim])
    V = property(lambda self: self.KV[:, :, self.cfg.head_dim:])
    B = property(lambda self: self.BCD[:, 0])
    C = property(lambda self: self.BCD[:, 1])
    D = property(lambda self: self.BCD[:, 2])
    E = property(lambda self: self.EF[:, 0])
    F = property(lambda self: self.EF[:, 1])

    # -- integer width proofs (raise for a config that would break them) ---------------------------
    def _check_widths(self):
        cfg, sfm = self.cfg, self.cfg.sfm
        d, S, P = cfg.head_dim, cfg.scale_raw, cfg.max_positions
        kv = 1 << (cfg.kv_width - 1)                 # |q|, |k|, |v| <= kv
        dot = d * kv * kv                             # |k.c|, |q.k|, |k|^2
        rc = sfm.mantissa_format.max_raw              # RECIP mantissa
        op = 1 << (cfg.ac_vpu.in_width - 1)           # |A_r|, |D_r|
        acc = 1 << (cfg.ac_acc_width - 1)             # |N|, |A|..|D|
        ef = 1 << (cfg.ef_width - 1)
        xm = 1 << (sfm.x_width - 1)                   # |m|, |x|
        coef = sfm.coef_format.max_raw                # |alpha|, |beta|, slopes, intercepts
        mf = sfm.mantissa_frac
        L62 = 1 << 62

        def need(ok, what):
            if not ok:
                raise ValueError(f"LadTileBatch: {what} does not fit its int64 method for this config")

        need(kv * kv < 1 << 31 and dot * S < L62, "score dot * scale")
        fb = self.fallback.sfm
        need(dot < EXACT_F64 and fb.out_format.max_raw * kv * cfg.kv_positions < EXACT_F64, "float64 dot products")
        need(2 * dot + 2 < L62 and (1 << (mf + cfg.kk_width + 1)) < L62, "EAS t")
        need(dot * rc < L62 and ((dot >> LIMB) + 1) * dot * rc < L62, "EAS dot**2 * rc")
        need(S < 1 << LIMB and rc < 1 << LIMB and xm < 1 << LIMB and acc < L62, "wide multiplier")
        qa = d * op * kv
        sa, sb, sc = cfg.n_cache_shifts
        za, zb, zc = cfg.z_cache_shifts
        need(min(sa, sb, sc, za, zb, zc) >= 0 and qa < L62, "cache-term shifts")
        need((qa >> min(sa, za)) * S < L62 and (S << max(sa, za)) < L62, "S q.A_r, S q.D_r")
        t1, t3 = (qa * S >> sa) + 1, (acc >> sc) + 1
        need(t1 + t3 <= L62 - acc and t1 + t3 + WIDE_LIM < 1 << 63, "N cache terms")
        z1, z2, z3 = (qa * S >> za) + 1, (xm * ef >> zb) + 1, (ef >> zc) + 1
        need(xm * ef < L62 and z1 + z2 + z3 < L62, "Z cache terms")
        w = (coef * xm + (coef << sfm.x_frac)) >> sfm.exp_shift
        need(xm * coef + (coef << sfm.x_frac) < L62 and w * kv * P + acc < L62, "N += w v")
        g = (coef * kv >> cfg.g_shift) + 1
        need(g * kv * (P + 1) + acc < L62 and coef * kv * (P + 1) + acc < L62, "cache updates")
        need(dot * rc << max(0, cfg.rho_frac - mf) < L62 and ef + coef * (P + 1) < L62, "rho, E, F")
        need((acc >> mf) * rc + (rc << mf) + (1 << (mf + sfm.recip_in_width)) < 1 << 63, "FINISH N * RECIP")

    # -- pieces ----------------------------------------------------------------------------------------
    def _score(self, dots: torch.Tensor) -> torch.Tensor:
        """golden.dense.score_raw from exact dot products."""
        return score_from_dots(dots, self.cfg)

    def _interval(self, x: torch.Tensor) -> torch.Tensor:
        """golden.sfm.exp_interval: the number of boundaries ``e_k`` with ``x < e_k``."""
        return self.n_bounds - torch.bucketize(x, self.bounds_asc, right=True)

    def _exp(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """golden.sfm.exp_pwl with the tables kept as tensors."""
        sfm = self.cfg.sfm
        r = self._interval(x)
        y = round_shift(self.slopes[r] * x + (self.intercepts[r] << sfm.x_frac), sfm.exp_shift)
        return saturate(y, sfm.out_format), r

    def _recip(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """golden.sfm.recip (z >= 0 within recip_in_width bits) with the tables kept as tensors."""
        sfm = self.cfg.sfm
        w, ib, db = sfm.recip_in_width, sfm.table_index_bits, sfm.table_delta_bits
        k = ((z[:, None] >= self.pow2).sum(-1) - 1).clamp(min=0)
        frac = (z << (w - 1 - k)) & ((1 << (w - 1)) - 1)
        j = frac >> (w - 1 - ib)
        rest = frac & ((1 << (w - 1 - ib)) - 1)
        low = w - 1 - ib - db
        delta = rest >> low if low >= 0 else rest << -low
        m = self.recip_c0[j] - round_shift(self.recip_c1[j] * delta, sfm.table_offset_shift)
        zero = z == 0
        return torch.where(zero, sfm.mantissa_format.max_raw, m), torch.where(zero, 0, k)

    def _center_update(self, dots: torch.Tensor, k: torch.Tensor, kk: torch.Tensor, Cm: int):
        """EAS for the new keys: (center index, rho, new-center mask); updates the center table."""
        cfg = self.cfg
        mf = cfg.sfm.mantissa_frac
        H = self.heads
        C = self.n_centers
        if Cm:
            rc, e = self.center_rm[:, :Cm], self.center_re[:, :Cm]
            # t = round_shift(|dot| * y, s), y = |dot| rc < 2**62, s = mf + e: |dot| * y as two limbs
            # (hi, lo); t <= 2 |k|**2 + 1 < 2**62 (Cauchy-Schwarz, 2**e <= |c|**2, rc <= 2**(mf+1)), so
            # floor((V + h) / 2**s) = ((hi << (31 - s1)) + ((lo + h) >> s1)) >> (s - s1), s1 = min(s, 31)
            pa = dots.abs()
            y = pa * rc
            hi, lo = mul_wide(y, pa & LOW)
            hi = hi + (pa >> LIMB) * y
            sh = mf + e
            s1 = sh.clamp(max=LIMB)
            t = ((hi << (LIMB - s1)) + ((lo + ((1 << sh) >> 1)) >> s1)) >> (sh - s1)
            if Cm > int(C.min()):
                t = torch.where(torch.arange(Cm)[None, :] < C[:, None], t, -1)
            best = t.argmax(1, keepdim=True)                                 # first maximum
            best_t = t.gather(1, best)[:, 0]
            prod = dots.gather(1, best)[:, 0] * rc.gather(1, best)[:, 0]
            sh = mf + e.gather(1, best)[:, 0] - cfg.rho_frac
            best = best[:, 0]
            join = (C > 0) & (((kk > 0) & ((best_t << COS_FRAC) >= cfg.cos2_raw * kk)) | (C >= cfg.max_centers))
            rho = torch.where(sh >= 0, round_shift(prod, sh.clamp(0, 62)),
                              prod.clamp(-(1 << 40), 1 << 40) << (-sh).clamp(0, 62))
            rho = saturate(rho, cfg.rho_format)
        else:
            best = rho = torch.zeros(H, dtype=torch.int64)
            join = torch.zeros(H, dtype=torch.bool)
        hn = (~join).nonzero().flatten()
        if hn.numel():
            slot = C[hn]
            m_, e_ = self._recip(kk[hn])
            self.centers[hn, slot] = center_value(k[hn], cfg).double()
            self.center_rm[hn, slot] = m_
            self.center_re[hn, slot] = e_
            self.n_centers = C + (~join).long()
        center = torch.where(join, best, C)
        rho = torch.where(join, rho, 1 << cfg.rho_frac)
        return center, rho, ~join

    def _cache_terms(self, q: torch.Tensor, m: torch.Tensor):
        """N (H, d) and Z (H,) from the caches (step 3), exact (see the module docstring)."""
        cfg = self.cfg
        op = FixedFormat(cfg.ac_vpu.in_width, 0)
        a_r = saturate(round_shift(self.A, cfg.cache_dot_shift), op)
        d_r = saturate(round_shift(self.BCD[:, 2], cfg.cache_dot_shift), op)
        qa = (a_r * q[:, None, :]).sum(-1)                                    # (H, d)
        qd = (d_r * q).sum(-1)                                                # (H,)
        sa, sb, sc = cfg.n_cache_shifts
        za, zb, zc = cfg.z_cache_shifts
        S = cfg.scale_raw
        t1 = (qa >> sa) * S + (((qa & ((1 << sa) - 1)) * S + ((1 << sa) >> 1)) >> sa)   # = round_shift(qa S, sa)
        t2 = round_shift_wide(*mul_wide(self.BCD[:, 0], m[:, None]), sb)     # clamped at +-2**62: see docstring
        N = saturate(t1 - t2 + round_shift(self.BCD[:, 1], sc), cfg.ac_vpu.acc_format)
        z1 = (qd >> za) * S + (((qd & ((1 << za) - 1)) * S + ((1 << za) >> 1)) >> za)
        E, F = self.EF.unbind(1)
        Z = saturate(z1 - round_shift(m * E, zb) + round_shift(F, zc), FixedFormat(cfg.z_width, 0))
        return N, Z

    def _cache_add(self, seg: Segments, alpha, beta, k, v, tail):
        """AC cache updates by the rows (``seg``: grouped by head, in order), then per head by the
        ``tail = (alpha, beta, k, v)`` of the new position; saturating after every add.
        Fast path per head and cache, when ``max|start| + sum of max|term|`` proves that no
        partial sum leaves the range: plain sums, ``A_h += [G_h; g]^T [K_h; k]`` as one batched
        int64 matmul over rows padded per head; otherwise the exact sequence for that head."""
        cfg, H = self.cfg, self.heads
        acc, ef = cfg.ac_vpu.acc_format, cfg.ef_format
        ta, tb, tk, tv = tail
        g = round_shift(alpha[:, None] * v, cfg.g_shift)
        tg = round_shift(ta[:, None] * tv, cfg.g_shift)
        ab, tab = torch.maximum(alpha.abs(), beta.abs()), torch.maximum(ta.abs(), tb.abs())
        reach = torch.zeros(H, 2, dtype=torch.int64).index_add_(
            0, seg.seg, torch.stack([g.abs().amax(1) * k.abs().amax(1), ab], 1))
        kvb = cfg.kv_width - 1
        bad = torch.stack([self.A.abs().flatten(1).amax(1) + reach[:, 0] + tg.abs().amax(1) * tk.abs().amax(1)
                           > acc.max_raw,
                           self.BCD.abs().flatten(1).amax(1) + ((reach[:, 1] + tab) << kvb) > acc.max_raw,
                           self.EF.abs().amax(1) + reach[:, 1] + tab > ef.max_raw], 1)
        # A: rows padded per head (slot = rank within the head), the new position in the last slot
        ends = seg.ends
        width = max(e - s for s, e in zip([0] + ends[:-1], ends)) + 1
        starts = torch.tensor([0] + ends[:-1], dtype=torch.int64)
        slot = torch.arange(seg.seg.numel()) - starts[seg.seg]
        Gp = torch.zeros(H, width, g.shape[1], dtype=torch.int64)
        Kp = torch.zeros(H, width, k.shape[1], dtype=torch.int64)
        Gp[seg.seg, slot], Kp[seg.seg, slot] = g, k
        Gp[:, -1], Kp[:, -1] = tg, tk
        A = self.A + torch.bmm(Gp.transpose(1, 2), Kp)
        BCD = self.BCD + torch.zeros_like(self.BCD).index_add_(
            0, seg.seg, torch.stack([alpha[:, None] * v, beta[:, None] * v, alpha[:, None] * k], 1)) \
            + torch.stack([ta[:, None] * tv, tb[:, None] * tv, ta[:, None] * tk], 1)
        EF = self.EF + torch.zeros_like(self.EF).index_add_(0, seg.seg, torch.stack([alpha, beta], 1)) \
            + torch.stack([ta, tb], 1)
        if bool(bad.any()):
            for h, (bad_a, bad_bcd, bad_ef) in enumerate(bad.tolist()):
                rows = seg.rows(h)
                if bad_a:
                    A[h] = sat_add_sequence(self.A[h], torch.cat([
                        g[rows, :, None] * k[rows, None, :], (tg[h, :, None] * tk[h, None, :])[None]]), acc)
                if bad_bcd:
                    a_, b_, k_, v_ = alpha[rows, None], beta[rows, None], k[rows], v[rows]
                    BCD[h] = sat_add_sequence(self.BCD[h], torch.cat([
                        torch.stack([a_ * v_, b_ * v_, a_ * k_], 1),
                        torch.stack([ta[h] * tv[h], tb[h] * tv[h], ta[h] * tk[h]])[None]]), acc)
                if bad_ef:
                    EF[h] = sat_add_sequence(self.EF[h], torch.cat([torch.stack([alpha[rows], beta[rows]], 1),
                                                                     torch.stack([ta[h], tb[h]])[None]]), ef)
        self.A, self.BCD, self.EF = A, BCD, EF

    def _nz_add(self, N, Z, seg: Segments, w, vc, p_new, v):
        """``N += w_i v_i``, ``Z += w_i`` over the candidates in order, then ``N += p_new v``,
        ``Z += p_new``, saturating after every add (the per-head model's two sequences)."""
        cfg, H = self.cfg, self.heads
        nf, zf = cfg.ac_vpu.acc_format, FixedFormat(cfg.z_width, 0)
        wsum = torch.zeros(H, 2, dtype=torch.int64).index_add_(0, seg.seg, torch.stack([w, w.abs()], 1))
        N1 = N + seg.sums(w[:, None] * vc) + p_new[:, None] * v
        Z1 = Z + wsum[:, 0] + p_new
        reach = wsum[:, 1] + p_new                      # sum of |terms| of Z; of N at most that times max|v|
        bad = (N.abs().amax(1) + (reach << (cfg.kv_width - 1)) > nf.max_raw) | (Z.abs() + reach > zf.max_raw)
        if bool(bad.any()):
            for h in bad.nonzero().flatten().tolist():
                rows = seg.rows(h)
                N1[h] = sat_add_sequence(N[h], torch.cat([w[rows, None] * vc[rows], (p_new[h] * v[h])[None]]), nf)
                Z1[h] = sat_add_sequence(Z[h], torch.cat([w[rows], p_new[h, None]]), zf)
        return N1, Z1

    def _finish(self, N: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """``o = sat(round_shift(N rm, mf + e))`` with ``(rm, e) = RECIP(clamp(Z))``. Exact in int64:
        with ``N = Nh 2**mf + Nl`` (``Nl`` in ``[0, 2**mf)``), ``floor((N rm + h) / 2**(mf+e)) =
        (Nh rm + ((Nl rm + h) >> mf)) >> e`` (nested floors), every term below ``2**62``."""
        cfg, sfm = self.cfg, self.cfg.sfm
        mf = sfm.mantissa_frac
        rm, e = self._recip(Z.clamp(0, (1 << sfm.recip_in_width) - 1))
        rm, e = rm[:, None], e[:, None]
        half = (1 << (mf + e)) >> 1
        o = (((N >> mf) * rm + (((N & ((1 << mf) - 1)) * rm + half) >> mf)) >> e)
        return saturate(o, cfg.kv_format)

    def _exact_step(self, q, k, v):
        """Past ``max_positions``: ``LadTileModel.exact_step`` for every head."""
        cfg, H, n, d = self.cfg, self.heads, self.n, self.cfg.head_dim
        zero = torch.zeros(H, dtype=torch.int64)
        stats = {key: zero.clone() for key in STAT_KEYS}
        stats["position"] = torch.full((H,), n, dtype=torch.int64)
        stats["centers"] = self.n_centers.clone()
        if n >= cfg.kv_positions:
            stats["path"] = torch.full((H,), int(StepPath.BEYOND), dtype=torch.int64)
            return torch.zeros(H, d, dtype=torch.int64), stats
        if self.KV_exact is None:
            self.KV_exact = torch.zeros(H, cfg.kv_positions, 2 * d, dtype=torch.float64)
            self.KV_exact[:, :n] = self.KV
        self.KV_exact[:, n, :d], self.KV_exact[:, n, d:] = k, v
        kv = self.KV_exact[:, :n + 1]
        fb = self.fallback           # golden.dense.dense_attention_bits, every head at once
        s = score_from_dots(exact_bmm(kv[:, :, :d], q.double()[:, :, None])[:, :, 0], fb)
        m = s.amax(1)
        p, _ = exp_pwl(saturate(s - m[:, None], fb.sfm.x_format), fb.sfm)
        z = p.sum(1)
        N = exact_bmm(p.double()[:, None, :], kv[:, :, d:])[:, 0]
        r, e = recip(z, fb.sfm)
        o = saturate(round_shift(N * r[:, None], fb.sfm.mantissa_frac + e[:, None]), fb.kv_format)
        stats["m"], stats["z"] = m, z
        self.n = n + 1
        stats["path"] = torch.full((H,), int(StepPath.EXACT), dtype=torch.int64)
        stats["kv_beats"] = torch.full((H,), 2 * (n + 1) * cfg.beats, dtype=torch.int64)
        return o, stats

    # -- one step ------------------------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Raw ``q, k, v (H, d)`` -> raw ``o (H, d)`` and the stats of ``LadTileModel.step``, each ``(H,)``."""
        cfg, sfm = self.cfg, self.cfg.sfm
        H, P, d = self.heads, cfg.max_positions, cfg.head_dim
        q, k, v = (torch.as_tensor(t).reshape(H, d).to(torch.int64) for t in (q, k, v))
        n = self.n
        zero = torch.zeros(H, dtype=torch.int64)
        if n >= P:
            return self._exact_step(q, k, v)
        xf = sfm.x_format
        heads = self._heads
        q32 = q.to(torch.int32)
        KVf = self.KV.view(H * P, 2 * d)
        # 1-2. EAS: center scores, the new key's center, approximate scores, m
        Cm = int(self.n_centers.max())
        cdots = exact_bmm(self.centers[:, :Cm], torch.stack([q, k], 2).double())  # (H, Cm, 2): c.q, c.k
        qcs = self._score(cdots[:, :, 0])
        kk = (k * k).sum(-1)
        center, rho, new_center = self._center_update(cdots[:, :, 1], k, kk, Cm)
        s_new = self._score((q * k).sum(-1))
        if n:
            s_hat = saturate(round_shift(qcs.gather(1, self.center_of[:, :n]) * self.rho[:, :n], cfg.rho_frac), xf)
            m = torch.maximum(s_hat.amax(1), s_new)
        else:
            s_hat = torch.zeros(H, 0, dtype=torch.int64)
            m = s_new
        # 3. AC cache terms (caches as they stand)
        N, Z = self._cache_terms(q, m)
        # 4. APID (each position's mode interval bounds are kept in mlo, mhi)
        x_hat = saturate(s_hat - m[:, None], xf)
        cand = (x_hat < self.mlo[:, :n]) | (x_hat >= self.mhi[:, :n])
        # 5. MD, candidates head-major in position order (each decision is the position's own)
        hc, ic = cand.nonzero().unbind(1)
        rows = hc * P + ic
        kvc = KVf.index_select(0, rows)                     # (M, 2d) int16: k | v of each candidate
        dots = (kvc[:, :d].to(torch.int32) * q32.index_select(0, hc)).sum(-1, dtype=torch.int64)
        x = saturate(self._score(dots) - m.index_select(0, hc), xf)
        r = self._interval(x)
        cmode = self.mode.view(-1).index_select(0, rows)
        bump_at = self.mode[:, :n].clone()                 # quiet: bump the mode; candidates: bump r
        bump_at.view(-1).index_copy_(0, hc * n + ic, r)
        cv = self.counters[:, :n]
        val = cv.gather(2, bump_at[:, :, None]) + 1
        cv.scatter_(2, bump_at[:, :, None], val)
        over = (val[:, :, 0] > cfg.counter_max).nonzero()
        if over.shape[0]:                                  # halve all counters of those positions
            ro = over[:, 0] * P + over[:, 1]
            cf = self.counters.view(H * P, -1)
            cf.index_copy_(0, ro, cf.index_select(0, ro) >> 1)
        cc = self.counters.view(H * P, -1).index_select(0, rows)
        act = r != cmode
        change = act & (cc.gather(1, r[:, None]) > cc.gather(1, cmode[:, None]))[:, 0]
        alpha = self.slopes[r] - self.slopes[cmode]
        beta = self.intercepts[r] - self.intercepts[cmode]
        w = round_shift(alpha * x + (beta << sfm.x_frac), sfm.exp_shift)
        # 6. the new position: N, Z (active candidates in order, then p_new), o
        p_new, r_new = self._exp(saturate(s_new - m, xf))
        # (false alarms have w = 0: adding their zero terms changes nothing)
        seg = Segments(hc, H)
        N, Z = self._nz_add(N, Z, seg, w, kvc[:, d:], p_new, v)
        o = self._finish(N, Z)
        # the caches: mode changes in order, then the absorption of the new position
        rch, rc = rows[change], r[change]
        sc = Segments(hc[change], H)
        kvch = kvc[change].long()
        self._cache_add(sc, alpha[change], beta[change], kvch[:, :d], kvch[:, d:],
                        (self.slopes[r_new], self.intercepts[r_new], k, v))
        self.mode.view(-1)[rch] = rc
        self.mlo.view(-1)[rch] = self.lo[rc]
        self.mhi.view(-1)[rch] = self.hi[rc]
        self.KV[:, n, :d], self.KV[:, n, d:] = k, v
        self.center_of[:, n], self.rho[:, n], self.mode[:, n] = center, rho, r_new
        self.mlo[:, n], self.mhi[:, n] = self.lo[r_new], self.hi[r_new]
        self.counters[:, n] = 0
        self.counters[heads, n, r_new] = 1
        self.n = n + 1
        nc = torch.bincount(hc, minlength=H)
        na = torch.bincount(hc[act], minlength=H)
        g = cfg.group
        if g > 1:
            union = torch.zeros(2, H, n, dtype=torch.bool)
            union[0, hc, ic] = True
            union[1, hc[act], ic[act]] = True
            gc, ga = union.view(2, H // g, g, n).any(2).sum(-1).repeat_interleave(g, 1)
        else:
            gc, ga = nc, na
        stats = {"position": torch.full((H,), n, dtype=torch.int64), "candidates": nc, "active": na,
                 "false_alarms": nc - na, "mode_changes": torch.bincount(sc.seg, minlength=H),
                 "path": zero, "m": m, "z": Z, "centers": self.n_centers.clone(),
                 "new_center": new_center.long(), "kv_beats": cfg.beats * (nc + na),
                 "group_candidates": gc, "group_active": ga}
        return o, stats
