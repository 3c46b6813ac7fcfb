"""Piecewise-linear exp of LAD (docs/algorithms.md §1.1): intervals, coefficients, lookup.

``exp(x)`` for ``x <= 0`` is replaced by ``p(x) = a_r x + b_r`` on interval ``r``:
interval 0 is ``[e_1, +inf)`` (x > 0, a running max that was underestimated, uses
this first segment), interval ``r`` is ``[e_{r+1}, e_r)`` and the last interval
``R`` is ``(-inf, e_R)`` with ``a = b = 0``.

Boundaries: relative error is shift-invariant for exp (``exp(x + c) = e^c exp(x)``),
so for a fixed cutoff ``e_R`` the max relative error over ``[e_R, 0]`` is minimised
by equal-width intervals, each holding the same minimax line shifted. On ``[-h, 0]``
the minimax relative-error line equioscillates at ``-h``, ``t* = 1 - b/a`` and 0,
which gives the closed form below (``E`` is the max relative error of every
interval): with ``c = (1 - e^-h)/h`` and ``K = c e^(1/c - 1)``,
``E = (K - 1)/(K + 1)``, ``a = (1 - E) c``, ``b = 1 - E``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from .errors import ConfigError


def minimax_line_on_unit_shape(h: float) -> tuple[float, float, float]:
    """Slope, intercept and max relative error of the best line for exp on ``[-h, 0]``."""
    c = (1.0 - math.exp(-h)) / h
    k = c * math.exp(1.0 / c - 1.0)
    err = (k - 1.0) / (k + 1.0)
    return (1.0 - err) * c, 1.0 - err, err


@dataclass(frozen=True)
class PwlTable:
    """The interval table: ``intervals`` finite intervals over ``[cutoff, 0]`` plus the zero interval."""

    intervals: int = 8
    cutoff: float = -8.0

    def __post_init__(self):
        if not 1 <= self.intervals <= 64:
            raise ConfigError(f"PWL intervals must be 1..64, got {self.intervals}")
        if not self.cutoff < 0:
            raise ConfigError(f"PWL cutoff must be negative, got {self.cutoff}")

    @property
    def width(self) -> float:
        return -self.cutoff / self.intervals

    @cached_property
    def boundaries(self) -> list[float]:
        """``[e_1, ..., e_R]``, decreasing, ``e_R = cutoff``."""
        return [-(k + 1) * self.width for k in range(self.intervals)]

    @cached_property
    def _lines(self):
        a0, b0, err = minimax_line_on_unit_shape(self.width)
        slopes, intercepts = [], []
        for r in range(self.intervals):
            upper = -r * self.width  # interval r is [upper - h, upper)
            scale = math.exp(upper)
            # p(x) = scale * (a0 (x - upper) + b0)
            slopes.append(scale * a0)
            intercepts.append(scale * (b0 - a0 * upper))
        slopes.append(0.0)
        intercepts.append(0.0)
        return slopes, intercepts, err

    @property
    def slopes(self) -> list[float]:
        """``a_0 .. a_R`` (``a_R = 0``)."""
        return self._lines[0]

    @property
    def intercepts(self) -> list[float]:
        """``b_0 .. b_R`` (``b_R = 0``)."""
        return self._lines[1]

    @property
    def max_relative_error(self) -> float:
        """Max ``|p(x)/exp(x) - 1|`` over ``[cutoff, 0]`` (analytic)."""
        return self._lines[2]

    def interval_of(self, x: torch.Tensor) -> torch.Tensor:
        """Interval index of each ``x``: the number of boundaries ``e_k`` with ``x < e_k``."""
        e = torch.tensor(self.boundaries, dtype=x.dtype)
        return (x.unsqueeze(-1) < e).sum(-1)

    def exp(self, x: torch.Tensor) -> torch.Tensor:
        """Float PWL exp (the float twin of the SFM's exp)."""
        x = torch.as_tensor(x, dtype=torch.float64)
        r = self.interval_of(x)
        a = torch.tensor(self.slopes, dtype=x.dtype)[r]
        b = torch.tensor(self.intercepts, dtype=x.dtype)[r]
        return a * x + b
