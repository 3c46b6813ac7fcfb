"""Vector processing unit (VPU): config, bit-accurate model and float twin.

The VPU has ``lanes`` multipliers and runs three operations on beats of ``lanes``
elements (docs/algorithms.md uses them everywhere: q·k scores and q·c_j center scores in
LAD §1.4, the q A / q D cache products of §1.2, the squared L2 match distance of MAC
§2, and the ``y += a x`` updates of caches A-F and of the merged output ``o``):

- ``DOT``:    ``acc = sat(acc + sum_l a_l * b_l)`` per beat; emits ``acc`` on the last beat.
- ``SQDIST``: ``acc = sat(acc + sum_l (a_l - b_l)**2)`` per beat; emits on the last beat.
- ``AXPY``:   per lane ``y_l = sat(acc_l + round_shift(scalar * a_l, axpy_shift))``, every beat.

Inputs are signed ``in_width``-bit integers (the caller owns the scale), except ``a``, every
product's second factor, which may be narrower (``a_width``: a KV beat against a wide operand,
half the multipliers per lane past 18 bits; SQDIST then cannot run); the accumulator is
``acc_width`` bits and saturates (never wraps). With no saturation DOT and SQDIST are exact;
AXPY is within half an LSB of the float ``acc + scalar*a/2**shift``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from amaranth.lib import enum

from .config import BlockConfig, param
from .fixedpoint import FixedFormat, round_shift, saturate


PIPELINE_LATENCY = 7   # the RTL's cycles from a beat's transfer to its result when nothing stalls


class VpuOp(enum.IntEnum, shape=2):
    """VPU operation (the ``op`` field of a VPU input beat)."""
    DOT = 0      # sum over beats of a*b
    SQDIST = 1   # sum over beats of (a-b)^2
    AXPY = 2     # per lane: acc + round_shift(scalar*a, axpy_shift)


@dataclass(frozen=True)
class VpuConfig(BlockConfig):
    lanes: int = param(8, "multipliers; one beat carries this many elements")
    in_width: int = param(16, "bits of each signed input element and of the AXPY scalar")
    acc_width: int = param(40, "bits of the signed saturating accumulator / output lanes")
    axpy_shift: int = param(15, "AXPY: right shift (round half up) of scalar*a before the add")
    a_width: int = param(0, "bits of each signed element of a, every product's second factor (DOT's "
                            "b*a, AXPY's scalar*a): 0 = in_width; narrower halves a product's "
                            "MULT18X18D past 18 bits, and leaves no SQDIST")
    stall_free: bool = param(False, "RTL: no clock enable (i and o always ready): its user takes every "
                                    "result the cycle it is valid (the same results and latency)")

    def validate(self):
        self.require(1 <= self.lanes <= 64, f"lanes must be 1..64, got {self.lanes}")
        self.require(2 <= self.in_width <= 30, f"in_width must be 2..30, got {self.in_width}")
        need = 2 * self.in_width + 2
        self.require(need <= self.acc_width <= 62,
                     f"acc_width must be {need}..62 (at least 2*in_width+2 so one squared "
                     f"difference fits), got {self.acc_width}")
        self.require(0 <= self.axpy_shift <= 2 * self.in_width,
                     f"axpy_shift must be 0..{2 * self.in_width}, got {self.axpy_shift}")
        self.require(self.a_width == 0 or 2 <= self.a_width <= self.in_width,
                     f"a_width must be 0 (in_width) or 2..in_width ({self.in_width}), got {self.a_width}")

    @property
    def in_format(self) -> FixedFormat:
        return FixedFormat(self.in_width, 0)

    @property
    def acc_format(self) -> FixedFormat:
        return FixedFormat(self.acc_width, 0)

    @property
    def a_format(self) -> FixedFormat:
        """The elements of ``a`` (``a_width``, 0 = ``in_width``)."""
        return FixedFormat(self.a_width or self.in_width, 0)

    @property
    def ops(self) -> frozenset:
        """The operations this format runs: SQDIST's ``a - b`` needs ``a`` at ``in_width``."""
        return frozenset(VpuOp) if self.a_format.width == self.in_width else frozenset((VpuOp.DOT, VpuOp.AXPY))


PRESETS = {
    "default": VpuConfig(),
    "narrow": VpuConfig(lanes=4, in_width=8, acc_width=20, axpy_shift=7),
    "wide": VpuConfig(lanes=16, in_width=18, acc_width=48, axpy_shift=17),
    # a 22-bit operand times a 16-bit a (mac-decode's VPU at 4 lanes): two MULT18X18D a product
    "kv_factor": VpuConfig(lanes=4, in_width=22, acc_width=52, axpy_shift=0, a_width=16),
    # the same, stall-free (as mac-decode builds its VPU)
    "stall_free": VpuConfig(lanes=4, in_width=22, acc_width=52, axpy_shift=0, a_width=16, stall_free=True),
}


def to_beats(vector: torch.Tensor, lanes: int) -> torch.Tensor:
    """Split a d-vector into ``ceil(d/lanes)`` beats, zero-padding the last."""
    d = vector.shape[-1]
    n = -(-d // lanes)
    out = torch.zeros(*vector.shape[:-1], n * lanes, dtype=vector.dtype)
    out[..., :d] = vector
    return out.reshape(*vector.shape[:-1], n, lanes)


def _check_a(a: torch.Tensor, op: int, cfg: VpuConfig) -> None:
    """``a`` and ``op`` within what ``cfg``'s multipliers take (else ValueError: no wrapped product)."""
    if op not in cfg.ops:
        raise ValueError(f"VPU: {VpuOp(op).name} needs a_width = in_width ({cfg.in_width}), got {cfg.a_width}")
    lo, hi = cfg.a_format.min_raw, cfg.a_format.max_raw
    if a.numel() and not (lo <= int(a.min()) and int(a.max()) <= hi):
        raise ValueError(f"VPU: a outside its {cfg.a_format.width} bits ({lo}..{hi})")


def reduce_beats(op: int, a_beats: torch.Tensor, b_beats: torch.Tensor, cfg: VpuConfig) -> int:
    """Bit-accurate DOT / SQDIST over beats ``(n, lanes)``: saturating accumulate per beat."""
    _check_a(a_beats, op, cfg)
    terms = a_beats * b_beats if op == VpuOp.DOT else (a_beats - b_beats) ** 2
    acc = 0
    for beat_sum in terms.sum(-1).tolist():
        acc = saturate(acc + beat_sum, cfg.acc_format)
    return acc


def axpy(scalar: int, a: torch.Tensor, acc: torch.Tensor, cfg: VpuConfig) -> torch.Tensor:
    """Bit-accurate AXPY lanes: ``sat(acc + round_shift(scalar * a, axpy_shift))``."""
    _check_a(a, VpuOp.AXPY, cfg)
    return saturate(acc + round_shift(scalar * a, cfg.axpy_shift), cfg.acc_format)


def reduce_float(op: int, a: torch.Tensor, b: torch.Tensor) -> float:
    """Float twin of :func:`reduce_beats` (no saturation)."""
    a, b = a.double(), b.double()
    return float((a * b).sum() if op == VpuOp.DOT else ((a - b) ** 2).sum())


def axpy_float(scalar: float, a: torch.Tensor, acc: torch.Tensor, cfg: VpuConfig) -> torch.Tensor:
    """Float twin of :func:`axpy`; ``|axpy - axpy_float| <= 0.5`` raw LSB without saturation."""
    return acc.double() + scalar * a.double() / 2.0 ** cfg.axpy_shift
