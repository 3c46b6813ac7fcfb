"""The RTL twins of golden.fixedpoint.round_shift and saturate, and the stall-all pipeline enable.

Every block rounds and saturates through these two functions only, so the RTL and the
bit-accurate model agree by construction of one definition each.
"""
from __future__ import annotations

from amaranth import Cat, Const, Mux, Shape, Value


def round_shift(value: Value, shift) -> Value:
    """``floor(value / 2**shift + 1/2)`` (round half up); ``shift <= 0`` multiplies.
    ``shift`` may be an unsigned Value (a barrel shifter): ``(v + (2**s >> 1)) >> s``."""
    if isinstance(shift, Value):
        return (value + ((Const(1, 1) << shift) >> 1)) >> shift
    if shift <= 0:
        return value << -shift
    return (value + (1 << (shift - 1))) >> shift


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


SPLIT_ADD_ABOVE = 48   # bits: a wider saturating add is split in two carry chains (carry select)


def saturating_add(a: Value, b: Value, shape, split_above: int = SPLIT_ADD_ABOVE) -> Value:
    """``saturate(a + b, shape)`` for signed ``a``, ``b`` and ``shape``, as a carry-select adder when
    ``shape`` is wider than ``split_above`` bits: the low half's sum runs beside the high half's
    two sums (carry in 0 and 1, each with its own range check), and the low half's carry picks one.
    An accumulator's loop (``acc <= sat(acc + x)``) cannot be retimed, so its carry chain and range
    check are shortened instead (AC's 62-bit accumulators: one 31-cell chain then the range check
    were its 98.9 MHz limit at ecp5-85f)."""
    shape = Shape.cast(shape)
    a, b = Value.cast(a), Value.cast(b)
    if shape.width <= split_above:
        return saturate(a + b, shape)
    k = shape.width // 2
    low = a[:k] + b[:k]                              # k + 1 bits: the low half and its carry out
    a_hi, b_hi = a[k:].as_signed(), b[k:].as_signed()
    # a_hi + b_hi + 1 as one chain and no inverter: (2 a_hi + 1) + (2 b_hi + 1) = 2 (a_hi + b_hi + 1)
    plus_one = (Cat(Const(1, 1), a_hi).as_signed() + Cat(Const(1, 1), b_hi).as_signed())[1:].as_signed()
    candidates = [saturate(Cat(low[:k], high).as_signed(), shape) for high in (a_hi + b_hi, plus_one)]
    return Mux(low[k], candidates[1], candidates[0])


def stall_all_enable(output_stream) -> Value:
    """Clock enable of a pipeline that stops as a whole when its output is stalled:
    the pipeline advances unless the output holds a payload the consumer has not taken."""
    return ~output_stream.valid | output_stream.ready


def index_width(n: int) -> int:
    """Bits of an index into ``n`` things (0..n-1), at least 1."""
    return max(1, (n - 1).bit_length())


def incr(value: Value, modulo: int) -> Value:
    """``value + 1``, wrapping to 0 after ``modulo - 1`` (a beat, slot or bank counter; as
    ``amaranth.lib.fifo``'s ``_incr``)."""
    return Mux(value == modulo - 1, 0, value + 1)
