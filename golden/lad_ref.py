"""Float reference of LAD decoding for one attention head (docs/algorithms.md §1).

Each :meth:`LadHead.step` runs the tile's modules in order: EAS (directional centers,
approximate scores ``s^_i = rho_i q.c_j(i) / sqrt(d)``, §1.4), the reference ``m``,
APID (candidates: ``x^_i`` outside the mode interval, counters of the others), MD
(exact scores of candidates, actual interval, alpha/beta, §1.3), AC
(``N = qA/sqrt(d) - mB + C + corrections``, ``Z`` likewise, §1.2-1.3, then the cache
updates of positions whose mode changed) and finally absorbs the newest positions
(§1.5). State is explicit (caches A-F, centers, per-position mode/counters/center/ratio)
so a bit-accurate model can mirror it step by step. Arithmetic is float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import BlockConfig, param
from .pwl import PwlTable

M_RULES = ("approx", "exact")
RATIO_RULES = ("projection", "norm")
FULL_TABLE_RULES = ("exact", "join")


@dataclass(frozen=True)
class LadConfig(BlockConfig):
    head_dim: int = param(64, "d: head dimension")
    pwl_intervals: int = param(8, "R: finite PWL intervals over [pwl_cutoff, 0] (plus the zero interval)")
    pwl_cutoff: float = param(-8.0, "e_R: below this x = s - m contributes nothing")
    center_cos: float = param(0.98, "a key joins center j when |cos(k, c_j)| >= this; else it becomes a center")
    ratio: str = param("projection", "rho of a key that joins center c: 'projection' k.c/|c|^2 (what the tile "
                                     "computes, no square root) or 'norm' sign(cos) |k|/|c| (the slides' wording)")
    max_centers: int = param(0, "center table size (0 = unbounded)")
    full_table: str = param("join", "a key that matches no center while the table is full: 'exact' (no center; "
                                    "a candidate at every step, its score always exact) or 'join' (joins its best "
                                    "center whatever the cosine)")
    counter_bits: int = param(4, "bits of each per-position, per-interval saturating mode counter")
    guard_margin: float = param(0.0, "APID widens each mode interval by this much on both sides")
    exact_recent: int = param(1, "newest positions computed exactly each step before absorption (>= 1)")
    m_rule: str = param("approx", "m = max of approximate scores + exact window scores ('approx') "
                                  "or the true max over all exact scores ('exact', oracle)")
    exact_scores: bool = param(False, "ablation: all scores exact (every position a candidate, m = true max): "
                                      "only the PWL error remains")
    exact_exp: bool = param(False, "ablation: output is softmax of exact scores (needs exact_scores)")
    scale: float = param(0.0, "score scale; 0 means 1/sqrt(head_dim)")

    def validate(self):
        self.require(1 <= self.head_dim <= 1024, f"head_dim must be 1..1024, got {self.head_dim}")
        self.require(1 <= self.pwl_intervals <= 64, f"pwl_intervals must be 1..64, got {self.pwl_intervals}")
        self.require(self.pwl_cutoff < 0, f"pwl_cutoff must be negative, got {self.pwl_cutoff}")
        self.require(0.0 < self.center_cos <= 1.0, f"center_cos must be in (0, 1], got {self.center_cos}")
        self.require(1 <= self.counter_bits <= 16, f"counter_bits must be 1..16, got {self.counter_bits}")
        self.require(self.guard_margin >= 0, f"guard_margin must be >= 0, got {self.guard_margin}")
        self.require(self.exact_recent >= 1, f"exact_recent must be >= 1, got {self.exact_recent}")
        self.require(self.ratio in RATIO_RULES, f"ratio must be one of {RATIO_RULES}, got {self.ratio!r}")
        self.require(self.max_centers >= 0, f"max_centers must be >= 0, got {self.max_centers}")
        self.require(self.full_table in FULL_TABLE_RULES,
                     f"full_table must be one of {FULL_TABLE_RULES}, got {self.full_table!r}")
        self.require(self.m_rule in M_RULES, f"m_rule must be one of {M_RULES}, got {self.m_rule!r}")
        self.require(self.scale >= 0, f"scale must be >= 0, got {self.scale}")
        self.require(not self.exact_exp or self.exact_scores, "exact_exp needs exact_scores=True")
        for name in ("pwl_cutoff", "guard_margin", "scale"):
            self.require(math.isfinite(getattr(self, name)), f"{name} must be finite, got {getattr(self, name)}")
        try:
            pwl = self.pwl
            usable = all(math.isfinite(x) for x in (*pwl.slopes, *pwl.intercepts, pwl.max_relative_error))
            why = "non-finite coefficients"
        except (ArithmeticError, ValueError) as err:
            usable, why = False, str(err)
        self.require(usable, f"no usable PWL table for pwl_intervals={self.pwl_intervals}, "
                             f"pwl_cutoff={self.pwl_cutoff} ({why})")

    @property
    def pwl(self) -> PwlTable:
        return PwlTable(self.pwl_intervals, self.pwl_cutoff)

    @property
    def score_scale(self) -> float:
        return self.scale if self.scale > 0 else 1.0 / math.sqrt(self.head_dim)

    @property
    def counter_max(self) -> int:
        return (1 << self.counter_bits) - 1


FULL_ATTENTION = dict(exact_scores=True, exact_exp=True)  # LadConfig(**FULL_ATTENTION) == full attention


class LadHead:
    """LAD decode state of ``heads`` independent heads (``heads=1``: one head; batching only for speed,
    no state is shared). ``K``/``V`` model main memory (the KV cache); everything else is on chip.

    Per head ``h`` and position ``i`` (``i < absorbed``): ``mode[h, i]``, ``counters[h, i, r]``,
    ``center_of[h, i]``, ``ratio[h, i]``; centers ``centers[h, :n_centers[h]]``; caches
    ``A[h] (d x d)``, ``B, C, D [h] (d)``, ``E, F [h]``. Positions ``absorbed..length-1`` form the
    exact window (newest + missing positions)."""

    def __init__(self, cfg: LadConfig, heads: int = 1):
        self.cfg, self.H = cfg, heads
        pwl = cfg.pwl
        d = cfg.head_dim
        f64 = torch.float64
        self.n_intervals = pwl.intervals + 1  # finite intervals + the zero interval
        self.a = torch.tensor(pwl.slopes, dtype=f64)
        self.b = torch.tensor(pwl.intercepts, dtype=f64)
        e = pwl.boundaries
        self.lo = torch.tensor(e + [-math.inf], dtype=f64)     # interval r is [lo[r], hi[r])
        self.hi = torch.tensor([math.inf] + e, dtype=f64)
        self._e = torch.tensor(e, dtype=f64)
        self._neg_e = -self._e                                    # increasing, for bucketize
        self.length = 0
        self.absorbed = 0
        self._cap = 0
        self._grow(64)
        self.centers = torch.zeros(heads, 64, d, dtype=f64)
        self.center_norm = torch.zeros(heads, 64, dtype=f64)
        self.n_centers = torch.zeros(heads, dtype=torch.long)
        self.A = torch.zeros(heads, d, d, dtype=f64)
        self.B = torch.zeros(heads, d, dtype=f64)
        self.C = torch.zeros(heads, d, dtype=f64)
        self.D = torch.zeros(heads, d, dtype=f64)
        self.E = torch.zeros(heads, dtype=f64)
        self.F = torch.zeros(heads, dtype=f64)

    def _grow(self, cap: int) -> None:
        H, d, R1 = self.H, self.cfg.head_dim, self.n_intervals

        def grown(t, *shape, dtype, fill=0):
            new = torch.full((H, cap, *shape), fill, dtype=dtype)
            if t is not None:
                new[:, :t.shape[1]] = t
            return new
        old = self._cap > 0
        self._K = grown(self._K if old else None, d, dtype=torch.float64)
        self._V = grown(self._V if old else None, d, dtype=torch.float64)
        self._center_of = grown(self._center_of if old else None, dtype=torch.long)
        self._ratio = grown(self._ratio if old else None, dtype=torch.float64)
        self._uncentered = grown(self._uncentered if old else None, dtype=torch.bool)
        self._mode = grown(self._mode if old else None, dtype=torch.long)
        self._counters = grown(self._counters if old else None, R1, dtype=torch.int32)
        self._ones = torch.ones(H, cap, dtype=torch.int32)
        self._cap = cap

    # views of the used part
    K = property(lambda self: self._K[:, :self.length])
    V = property(lambda self: self._V[:, :self.length])
    center_of = property(lambda self: self._center_of[:, :self.length])
    ratio = property(lambda self: self._ratio[:, :self.length])
    mode = property(lambda self: self._mode[:, :self.absorbed])
    counters = property(lambda self: self._counters[:, :self.absorbed])

    def interval_of(self, x: torch.Tensor) -> torch.Tensor:
        """Interval index: the number of boundaries ``e_k`` with ``x < e_k`` (as :meth:`PwlTable.interval_of`)."""
        return torch.bucketize(-x, self._neg_e)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float64).reshape(self.H, self.cfg.head_dim)

    # -- EAS: centers -------------------------------------------------------------------------
    def add_key(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """EAS center update for a new key (one per head), and write k/v to main memory."""
        k, v = self._heads(k), self._heads(v)
        if self.length == self._cap:
            self._grow(2 * self._cap)
        hs = torch.arange(self.H)
        norm = k.norm(dim=-1)
        Cn = int(self.n_centers.max())
        cos = (self.centers[:, :Cn] @ k.unsqueeze(-1)).squeeze(-1) / (self.center_norm[:, :Cn] * norm[:, None]).clamp_min(1e-300)
        cos = torch.where(torch.arange(Cn) < self.n_centers[:, None], cos, torch.zeros_like(cos))
        j = cos.abs().argmax(-1) if Cn else torch.zeros(self.H, dtype=torch.long)
        best = cos[hs, j] if Cn else torch.zeros(self.H, dtype=torch.float64)
        join = (best.abs() >= self.cfg.center_cos) & (norm > 0)
        full = (self.n_centers >= self.cfg.max_centers) if self.cfg.max_centers else torch.zeros_like(join)
        if self.cfg.full_table == "join":                          # table full: join the best center
            join |= full
        uncentered = full & ~join                                  # rule "exact": no center, always read
        new = ~join & ~uncentered
        if int(self.n_centers.max()) + 1 > self.centers.shape[1]:
            cap = 2 * self.centers.shape[1]
            c = torch.zeros(self.H, cap, self.cfg.head_dim, dtype=torch.float64)
            c[:, :self.centers.shape[1]] = self.centers
            cn = torch.zeros(self.H, cap, dtype=torch.float64)
            cn[:, :self.center_norm.shape[1]] = self.center_norm
            self.centers, self.center_norm = c, cn
        slot = torch.where(join | uncentered, j, self.n_centers)
        cnorm = self.center_norm[hs, j].clamp_min(1e-300)
        if self.cfg.ratio == "projection":                         # k.c / |c|^2 = cos |k| / |c|
            joined = best * norm / cnorm
        else:
            joined = torch.sign(best) * norm / cnorm
        rho = torch.where(join, joined, torch.ones_like(norm)).masked_fill(uncentered, 0.0)
        nh = hs[new]
        self.centers[nh, self.n_centers[nh]] = k[nh]
        self.center_norm[nh, self.n_centers[nh]] = norm[nh]
        self.n_centers += new.long()
        i = self.length
        self._center_of[:, i] = slot
        self._ratio[:, i] = rho
        self._uncentered[:, i] = uncentered
        self._K[:, i] = k
        self._V[:, i] = v
        self.length += 1

    def prefill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Positions written by a prefill (full attention elsewhere), ``k, v (heads, P, d)``: centers
        assigned, not yet absorbed; the next step computes them exactly and absorbs them
        (the slides' "missing positions")."""
        k = k.reshape(self.H, -1, self.cfg.head_dim)
        v = v.reshape(self.H, -1, self.cfg.head_dim)
        for i in range(k.shape[1]):
            self.add_key(k[:, i], v[:, i])

    # -- caches ---------------------------------------------------------------------------------
    def _cache_add(self, hh: torch.Tensor, ii: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> None:
        """AC cache update for (head, position) pairs: A += alpha k^T v, B += alpha v, C += beta v,
        D += alpha k, E += alpha, F += beta."""
        if hh.numel() == 0:
            return
        k, v = self._K[hh, ii], self._V[hh, ii]
        w = torch.zeros(self.H, hh.numel(), dtype=torch.float64)      # scatter by one-hot matmul
        w[hh, torch.arange(hh.numel())] = 1.0
        d = self.cfg.head_dim
        self.A += (w @ (alpha[:, None] * k).unsqueeze(-1).mul(v.unsqueeze(1)).reshape(-1, d * d)).reshape(-1, d, d)
        self.B += w @ (alpha[:, None] * v)
        self.C += w @ (beta[:, None] * v)
        self.D += w @ (alpha[:, None] * k)
        self.E += w @ alpha
        self.F += w @ beta

    # -- one decode step ---------------------------------------------------------------------
    def step(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor):
        """Attention output ``(heads, d)`` (``(d,)`` for one head) of query ``q`` over all positions
        including the new one, and the step's stats (summed over heads)."""
        cfg, H = self.cfg, self.H
        q = self._heads(q)
        sc = cfg.score_scale
        self.add_key(k_new, v_new)                                       # EAS: center update
        na, n = self.absorbed, self.length
        K, V = self._K[:, :n], self._V[:, :n]
        qv = q.unsqueeze(-1)
        s_all = (K @ qv).squeeze(-1) * sc                                # exact scores (H, n)
        s_win = s_all[:, na:]                                             # exact window: read
        # EAS: approximate scores of absorbed positions (one dot product per center)
        qc = (self.centers @ qv).squeeze(-1)
        s_hat = self._ratio[:, :na] * qc.gather(1, self._center_of[:, :na]) * sc
        unc = self._uncentered[:, :na]                                   # no center: always a candidate
        if bool(unc.any()):
            s_hat = s_hat.masked_fill(unc, -math.inf)
        if cfg.m_rule == "exact" or cfg.exact_scores:
            m = s_all.max(-1).values
        elif na:
            m = torch.maximum(s_hat.max(-1).values, s_win.max(-1).values)
        else:
            m = s_win.max(-1).values
        mode = self._mode[:, :na]
        # APID: candidates = approximate x outside the (guarded) mode interval
        x_hat = s_hat - m[:, None]
        g = cfg.guard_margin
        cand = (x_hat < self.lo[mode] - g) | (x_hat >= self.hi[mode] + g) | unc
        if cfg.exact_scores:
            cand = torch.ones_like(cand)
        # MD: exact scores of candidates -> actual interval; active = actual != mode
        x_all = s_all - m[:, None]
        r_all = self.interval_of(x_all)
        x, r_true = x_all[:, :na], r_all[:, :na]
        act = cand & (r_true != mode)
        r = torch.where(act, r_true, mode)
        alpha = self.a[r] - self.a[mode]                                  # 0 where not active
        beta = self.b[r] - self.b[mode]
        # counters: quiet positions bump their mode (APID), candidates their actual interval (MD)
        ctr = self._counters[:, :na]
        ri = r.unsqueeze(-1)
        ctr.scatter_add_(2, ri, self._ones[:, :na].unsqueeze(-1))
        over = ctr.gather(2, ri).squeeze(-1) > cfg.counter_max
        if bool(over.any()):
            ctr[over] >>= 1
        # AC: N = qA/sqrt(d) - mB + C + sum_J (alpha x + beta) v + exact window, Z likewise
        w = torch.cat([alpha * x + beta, self.a[r_all[:, na:]] * x_all[:, na:] + self.b[r_all[:, na:]]], 1)
        N = (q.unsqueeze(1) @ self.A).squeeze(1) * sc - m[:, None] * self.B + self.C + (w.unsqueeze(1) @ V).squeeze(1)
        Z = (self.D * q).sum(-1) * sc - m * self.E + self.F + w.sum(-1)
        if cfg.exact_exp:
            out = (torch.softmax(s_all, -1).unsqueeze(1) @ V).squeeze(1)
        else:
            out = N / Z[:, None]
        # AC: active positions whose actual-interval counter overtook the mode's change mode
        chg = act & (ctr.gather(2, ri).squeeze(-1) > ctr.gather(2, mode.unsqueeze(-1)).squeeze(-1))
        n_chg = int(chg.sum())
        if n_chg:
            hh, ii = chg.nonzero(as_tuple=True)
            self._cache_add(hh, ii, alpha[hh, ii], beta[hh, ii])
            self._mode[hh, ii] = r[hh, ii]
        n_cand, n_act = int(cand.sum()), int(act.sum())
        missed = int(((~cand) & (r_true != mode)).sum())                    # misclassified (oracle)
        # absorb the window positions that leave it (keep the exact_recent - 1 newest)
        n_leave = max(0, (n - na) - (cfg.exact_recent - 1))
        if n_leave:
            rr = r_all[:, na:na + n_leave]
            aa, bb = self.a[rr], self.b[rr]
            k, v = K[:, na:na + n_leave], V[:, na:na + n_leave]
            self.A += (k * aa.unsqueeze(-1)).transpose(1, 2) @ v
            self.B += (aa.unsqueeze(1) @ v).squeeze(1)
            self.C += (bb.unsqueeze(1) @ v).squeeze(1)
            self.D += (aa.unsqueeze(1) @ k).squeeze(1)
            self.E += aa.sum(-1)
            self.F += bb.sum(-1)
            self._mode[:, na:na + n_leave] = rr
            self._counters[:, na:na + n_leave] = 0
            self._counters[:, na:na + n_leave].scatter_(2, rr.unsqueeze(-1), 1)
            self.absorbed += n_leave
        stats = {
            "heads": H, "positions": n, "candidates": n_cand, "active": n_act,
            "false_alarms": n_cand - n_act, "mode_changes": n_chg, "missed": missed,
            "centers": int(self.n_centers.sum()), "keys_read": n_cand + H * (n - na),
            "values_read": n_act + H * (n - na),
        }
        return (out[0] if H == 1 else out), stats


def full_attention(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float) -> torch.Tensor:
    """Exact softmax attention of one query over ``K``/``V`` (the baseline)."""
    s = (K.double() @ q.double()) * scale
    return torch.softmax(s, 0) @ V.double()
