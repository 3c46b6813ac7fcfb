"""Fixed-point formats and the one rounding and saturation point of the project.

Every integer model in golden/ and every RTL block rounds with :func:`round_shift`
(round half up: ``floor(x / 2**s + 1/2)``, i.e. add half an LSB then arithmetic
shift right) and saturates with :func:`saturate`. The RTL implements exactly these
two functions (hdl/lib/arith.py); nothing else rounds.

Values are ``torch.int64`` tensors (or Python ints) holding the raw integer; a
:class:`FixedFormat` says how many bits the hardware register has and where the
binary point is: ``real = raw * 2**-frac``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError


def rounding_half(shift: int) -> int:
    """The constant that :func:`round_shift` adds before shifting right by ``shift`` (0 when it
    does not shift right)."""
    return (1 << (shift - 1)) if shift > 0 else 0


def round_shift(x, shift):
    """Divide by ``2**shift`` rounding half up: ``(x + (2**shift >> 1)) >> shift``.

    ``shift`` is an int (``<= 0`` multiplies exactly) or a tensor of shifts ``>= 0``
    (a barrel shifter in the RTL)."""
    if isinstance(shift, torch.Tensor):
        # the half is 1 << (shift - 1): at shift 63, (1 << 63) >> 1 overflows int64 to -2^62
        # (an EXP2 exponent of 63 then gave a weight of -1); shifts past 63 keep half = 0
        half = torch.where((shift >= 1) & (shift <= 63), torch.ones_like(shift) << (shift - 1).clamp(0, 62),
                           torch.zeros_like(shift))
        return (x + half) >> shift
    if shift <= 0:
        return x * (1 << -shift)
    return (x + rounding_half(shift)) >> shift


def saturate(x, fmt: "FixedFormat"):
    """Clamp raw integers into the range of ``fmt``."""
    if isinstance(x, torch.Tensor):
        return torch.clamp(x, fmt.min_raw, fmt.max_raw)
    return max(fmt.min_raw, min(fmt.max_raw, x))


@dataclass(frozen=True)
class FixedFormat:
    """A two's-complement (or unsigned) fixed-point register: ``width`` bits, ``frac`` of them fraction."""

    width: int
    frac: int
    signed: bool = True

    def __post_init__(self):
        if self.width < 1 or self.width > 62:
            raise ConfigError(f"fixed-point width must be 1..62 bits, got {self.width}")

    @property
    def min_raw(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max_raw(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def lsb(self) -> float:
        return 2.0 ** -self.frac

    @property
    def min_value(self) -> float:
        return self.min_raw * self.lsb

    @property
    def max_value(self) -> float:
        return self.max_raw * self.lsb

    def quantize(self, x) -> torch.Tensor:
        """Nearest representable raw value of real ``x`` (half up), saturated."""
        x = torch.as_tensor(x, dtype=torch.float64)
        return saturate(torch.floor(x * (2.0 ** self.frac) + 0.5).to(torch.int64), self)

    def to_float(self, raw) -> torch.Tensor:
        return torch.as_tensor(raw, dtype=torch.float64) * self.lsb

    def __str__(self):
        return f"{'s' if self.signed else 'u'}{self.width}.{self.frac}"


def to_unsigned_bits(raw: int, width: int) -> int:
    """Two's-complement bit pattern of ``raw`` in ``width`` bits (for packing payloads)."""
    return raw & ((1 << width) - 1)


def from_unsigned_bits(bits: int, width: int, signed: bool = True) -> int:
    """Inverse of :func:`to_unsigned_bits`."""
    bits &= (1 << width) - 1
    if signed and bits >> (width - 1):
        return bits - (1 << width)
    return bits
