"""The RTL twins of golden.fixedpoint.round_shift and saturate, and the stall-all pipeline enable.

Every block rounds and saturates through these two functions only, so the RTL and the
bit-accurate model agree by construction of one definition each.
"""
from __future__ import annotations

from amaranth import Const, Mux, Shape, Value

from golden.fixedpoint import rounding_half


def round_shift(value: Value, shift) -> Value:
    """``floor(value / 2**shift + 1/2)`` (round half up); ``shift <= 0`` multiplies.
    ``shift`` may be an unsigned Value (a barrel shifter): ``(v + (2**s >> 1)) >> s``."""
    if isinstance(shift, Value):
        return (value + ((Const(1, 1) << shift) >> 1)) >> shift
    if shift <= 0:
        return value << -shift
    return (value + rounding_half(shift)) >> shift


def saturate(value: Value, shape: Shape) -> Value:
    """Clamp ``value`` into the range of ``shape`` (signed or unsigned).

    Range checks use the bits above the target width (all equal to the sign: it fits),
    not full-width comparisons, so no carry chain is added after the arithmetic."""
    shape = Shape.cast(shape)
    value = Value.cast(value)
    width, vshape = shape.width, value.shape()
    negative = value[-1] if vshape.signed else Const(0, 1)
    if shape.signed:
        lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
        if vshape.width < width or (vshape.signed and vshape.width == width):
            return value  # always in range
        upper = value[width - 1:]
        fits = (upper == 0) | ((upper == (1 << len(upper)) - 1) if vshape.signed else Const(0, 1))
        return Mux(fits, value[:width], Mux(negative, lo, hi)).as_signed()[:width].as_signed()
    hi = (1 << width) - 1
    over = value[width:].any() if vshape.width > width else Const(0, 1)
    return Mux(negative, 0, Mux(over, hi, value[:width]))[:width]


def saturating_add(a: Value, b: Value, shape) -> Value:
    """``saturate(a + b, shape)`` for an ``a`` of ``shape`` (signed) and a signed ``b``, where
    ``b`` is clamped first to one bit more than ``shape`` when it is wider: exact, since a ``b``
    beyond that is clamped to ``2 max + 1`` (or ``2 min``) and ``a + b`` reaches ``max`` (``min``)
    either way. The sum then has three bits above ``shape``'s sign, so the range check after the
    carry chain reads three bits, not all of a wide addend's. An accumulator's loop
    (``acc <= sat(acc + x)``) cannot be retimed: AC's 62-bit accumulator + its 65-bit beat sum,
    the chain then the range check, were lad-ac's 98.9 MHz limit (docs/lad-tile.md)."""
    shape = Shape.cast(shape)
    b = Value.cast(b)
    if len(b) > shape.width + 1:
        b = saturate(b, Shape(shape.width + 1, True))
    return saturate(a + b, shape)


def stall_all_enable(output_stream) -> Value:
    """Clock enable of a pipeline that stops as a whole when its output is stalled:
    the pipeline advances unless the output holds a payload the consumer has not taken. An
    always-ready output (a stall-free pipeline, whose user takes every result as it comes)
    never stalls: 1, no enable."""
    if output_stream.signature.always_ready:
        return Const(1)
    return ~output_stream.valid | output_stream.ready


def set_ready(m, stream_port, value) -> None:
    """``stream_port.ready = value`` (comb), unless the stream is always ready (no ``ready`` wire)."""
    if not stream_port.signature.always_ready:
        m.d.comb += stream_port.ready.eq(value)


def index_width(n: int) -> int:
    """Bits of an index into ``n`` things (0..n-1), at least 1."""
    return max(1, (n - 1).bit_length())


def incr(value: Value, modulo: int) -> Value:
    """``value + 1``, wrapping to 0 after ``modulo - 1`` (a beat, slot or bank counter; as
    ``amaranth.lib.fifo``'s ``_incr``)."""
    return Mux(value == modulo - 1, 0, value + 1)
