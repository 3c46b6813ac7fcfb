"""The RTL twins of golden.fixedpoint.round_shift and saturate, and the stall-all pipeline enable.

Every block rounds and saturates through these two functions only, so the RTL and the
bit-accurate model agree by construction of one definition each.
"""
from __future__ import annotations

from amaranth import Const, Mux, Shape, Value


def round_shift(value: Value, shift) -> Value:
    """``floor(value / 2**shift + 1/2)`` (round half up); ``shift <= 0`` multiplies.
    ``shift`` may be an unsigned Value (a barrel shifter): ``(v + (2**s >> 1)) >> s``."""
    if isinstance(shift, Value):
        return (value + ((Const(1, 1) << shift) >> 1)) >> shift
    if shift <= 0:
        return value << -shift
    return (value + (1 << (shift - 1))) >> shift


def saturate(value: Value, shape: Shape) -> Value:
    """Clamp ``value`` into the range of ``shape`` (signed or unsigned)."""
    shape = Shape.cast(shape)
    if shape.signed:
        lo, hi = -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    else:
        lo, hi = 0, (1 << shape.width) - 1
    clamped = Mux(value > hi, hi, Mux(value < lo, lo, value))
    return clamped[:shape.width].as_signed() if shape.signed else clamped[:shape.width]


def stall_all_enable(output_stream) -> Value:
    """Clock enable of a pipeline that stops as a whole when its output is stalled:
    the pipeline advances unless the output holds a payload the consumer has not taken."""
    return ~output_stream.valid | output_stream.ready
