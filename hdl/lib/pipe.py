"""Timing helpers: a multiply split into partial products that each fit one ECP5
MULT18X18D, so the products can be registered before the adder that sums them.

Yosys (``synth_ecp5``) decomposes a wide ``a * b`` into 18x18 DSPs and sums the pieces
combinationally in the same cycle: DSP delay plus a long carry chain between two
registers. ``partial_products`` returns the pieces (each <= 18x18 bits, shifted into
place) so a block can register them in one stage and add them (with any rounding
constant) in the next; the sum is exactly ``a * b``.
"""
from __future__ import annotations

from amaranth import Array, Cat, Const, Mux, Signal, Value, signed, unsigned

from .arith import saturate

CHUNK = 17  # low chunks are unsigned 17 bits: with a sign bit they fit the DSP's 18


def _chunks(v, width: int, is_signed: bool):
    """[(piece, shift)]: ``v`` cut into CHUNK-bit unsigned low pieces and a top piece of at
    most CHUNK + 1 bits (signed when ``v`` is)."""
    out, lo = [], 0
    while width - lo > CHUNK + 1:
        out.append((v[lo:lo + CHUNK], lo))
        lo += CHUNK
    top = v[lo:width]
    out.append((top.as_signed() if is_signed else top, lo))
    return out


def _operand(x):
    if isinstance(x, int):
        if x == 0:
            return Const(0, 1), 1, False
        shape = signed(x.bit_length() + 1) if x < 0 else unsigned(x.bit_length())
        return Const(x, shape), shape.width, shape.signed
    x = Value.cast(x)
    return x, x.shape().width, x.shape().signed


def partial_products(a, b) -> list[tuple[Value, int]]:
    """``[(a_i * b_j, shift)]`` with ``sum(p << shift) == a * b``; ``b`` may be an int."""
    va, wa, sa = _operand(a)
    vb, wb, sb = _operand(b)
    pieces = []
    for pa, sha in _chunks(va, wa, sa):
        for pb, shb in _chunks(vb, wb, sb):
            pieces.append((pa * pb, sha + shb))
    return pieces


def register_partials(m, ce, pieces, name: str) -> list[tuple[Signal, int]]:
    """The pieces in registers (loaded when ``ce``)."""
    regs = []
    for n, (value, shift) in enumerate(pieces):
        reg = Signal(value.shape(), name=f"{name}_pp{n}")
        with m.If(ce):
            m.d.sync += reg.eq(value)
        regs.append((reg, shift))
    return regs


def registered_product(m, a, b, name: str) -> list[tuple[Signal, int]]:
    """The pieces of ``a * b`` (:func:`partial_products`) registered twice, loaded every cycle:
    the first register goes into the MULT18X18D (synth/absorb.py), the second stays in the
    fabric, so only routing lies between the DSP's pins and a register."""
    return register_partials(m, 1, register_partials(m, 1, partial_products(a, b), f"{name}_a"), f"{name}_b")


def delayed(m, value: Value, name: str) -> Signal:
    """``value`` one cycle later (a register loaded every cycle)."""
    reg = Signal.like(value, name=name) if isinstance(value, Signal) else Signal(value.shape(), name=name)
    m.d.sync += reg.eq(value)
    return reg


def selected_in_two(m, values, index: Value, name: str) -> Signal:
    """``values[index]`` two cycles later, in two registered steps: each group of up to four
    selected by ``index``'s low bits into a register (beside a copy of its high bits), then the
    group by that copy. For a wide select from registers spread over the die (an 8:1 of 40-bit registers
    by one index, placed apart, was 10.2-10.6 ns routed in one step)."""
    low = min(2, max(1, (len(values) - 1).bit_length()))
    groups = [values[g:g + 2 ** low] for g in range(0, len(values), 2 ** low)]
    picked = [delayed(m, Array(g)[index[:low]] if len(g) > 1 else g[0], f"{name}_group{i}")
              for i, g in enumerate(groups)]
    high = delayed(m, index[low:], f"{name}_high")
    return delayed(m, Array(picked)[high] if len(picked) > 1 else picked[0], name)


def delayed_write(m, buf, take: Value, index: Value, data: Value, name: str) -> None:
    """``buf[index] = data`` a cycle after ``take``, from registered copies of all three: a
    stream handshake that ``take`` stands for then reaches a few registers, not the enables of
    every bit of ``buf`` (for a buffer read some cycles after it is written)."""
    index_d, data_d = delayed(m, index, f"{name}_index"), delayed(m, data, f"{name}_data")
    with m.If(delayed(m, take, f"{name}_take")):
        m.d.sync += buf[index_d].eq(data_d)


def masked_copies(m, next_word: Value, n: int, name: str) -> list[Value]:
    """``n`` registered copies of ``next_word`` taken every cycle (no latency beyond the one
    register: unlike :func:`lane_copies`), one per far-apart group of consumers. Yosys merges
    flip-flops with the same input, so copy ``i`` holds ``next_word ^ i`` (distinct inputs) and
    is returned as ``reg ^ i`` (a constant, folded into the consumers). At most
    ``2 ** len(next_word)`` copies: the consumers ``c`` share ``copies[c % len(copies)]``."""
    count = min(n, 1 << len(next_word))
    regs = [Signal(len(next_word), name=f"{name}_c{i}") for i in range(count)]
    m.d.sync += [reg.eq(next_word ^ i) for i, reg in enumerate(regs)]
    return [reg ^ i for i, reg in enumerate(regs)]


def lane_copies(m, word: Value, load: Value, n: int, name: str) -> list[Value]:
    """``n`` registered copies of ``word`` (taken when ``load``), one per consumer, so that no
    register drives the logic of every consumer. Yosys merges flip-flops with the same input,
    so the copies are a binary tree of registers, each feeding one child as is and one
    inverted (inputs that differ); each leaf is returned with its inversion undone (a
    constant, folded into the consumers' LUTs). The first level loads with ``load``, the
    others follow every cycle: the copies equal ``word`` ceil(log2 n) - 1 cycles after the
    first level has loaded it."""
    level, inverted = [word], [False]
    for depth in range(max(1, (n - 1).bit_length())):
        nxt, nxt_inv = [], []
        for parent, inv in zip(level, inverted):
            for flip in (False, True):
                reg = Signal(len(word), name=f"{name}_t{depth}_{len(nxt)}")
                d = ~parent if flip else parent
                if depth == 0:
                    with m.If(load):
                        m.d.sync += reg.eq(d)
                else:
                    m.d.sync += reg.eq(d)
                nxt.append(reg)
                nxt_inv.append(inv ^ flip)
        level, inverted = nxt, nxt_inv
    return [~reg if inv else reg for reg, inv in zip(level[:n], inverted[:n])]


def placed(pieces) -> list[Value]:
    """The pieces ``[(p, shift)]`` shifted into place (``p << shift``): the terms whose sum is the product."""
    return [(p << sh) if sh else p for p, sh in pieces]


def sum_partials(regs, extra=None) -> Value:
    """``sum(p << shift) (+ extra)``: the registered pieces added back together."""
    terms = placed(regs)
    if extra is not None:
        terms.append(extra)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def tree_sum(values) -> Value:
    """Sum of ``values`` as a balanced adder tree (log2(n) adders deep, not n - 1)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def leading_one(v: Value) -> Value:
    """Index of the highest set bit of ``v`` (0 when ``v`` is 0) as a balanced tree of
    muxes, log2(width) deep (a priority chain over the bits is width deep)."""
    v = Value.cast(v)
    width = 1 << max(1, (len(v) - 1).bit_length())
    padded = v.as_unsigned() if len(v) == width else Cat(v.as_unsigned(), Const(0, width - len(v)))

    def tree(bits):
        if len(bits) == 2:
            return bits[1], bits[0] | bits[1]
        half = len(bits) // 2
        hi_index, hi_any = tree(bits[half:])
        lo_index, lo_any = tree(bits[:half])
        return Cat(Mux(hi_any, hi_index, lo_index), hi_any), hi_any | lo_any

    return tree(padded)[0]


def extend(t: Value, width: int) -> Value:
    """``t`` sign- or zero-extended (or cut) to ``width`` bits, as an unsigned bit pattern."""
    t = Value.cast(t)
    if len(t) >= width:
        return t.as_unsigned()[:width]
    fill = t[-1].replicate(width - len(t)) if t.shape().signed else Const(0, width - len(t))
    return Cat(t.as_unsigned(), fill)


def csa_reduce(m, terms, width: int, name: str) -> list[Value]:
    """``terms`` (sign- or zero-extended to ``width`` bits) reduced to at most two with the same
    sum modulo ``2**width``: 3:2 carry-save compressors, one LUT level each, no carry chain.
    Each level's terms are combinational signals (``name``): a compressor reads each input
    three times, and Amaranth's lowering copies an expression per use, so a tree of
    expressions grew 3x per level in the netlist (the same function after Yosys merges it, but
    1,858 shifters for the SFM's 16-bit constant product). Call it outside ``m.If`` and FSM
    states: there its wires would be driven only under the condition (same results, one more
    mux per bit)."""
    def wires(level, values):
        out = [Signal(width, name=f"{name}_csa{level}_{n}") for n in range(len(values))]
        m.d.comb += [w.eq(v) for w, v in zip(out, values)]
        return out

    terms = [extend(t, width) for t in terms]
    level = 0
    while len(terms) > 2:
        terms = wires(level, terms)
        nxt = []
        for i in range(0, len(terms) - 2, 3):
            a, b, c = terms[i:i + 3]
            nxt.append(a ^ b ^ c)
            nxt.append(Cat(Const(0, 1), ((a & b) | (a & c) | (b & c))[:width - 1]))
        nxt.extend(terms[len(terms) - len(terms) % 3:])
        terms = nxt
        level += 1
    return terms


def constant_product(m, x, c: int, width: int, name: str) -> list[Value]:
    """``x * c`` for unsigned ``x`` and a constant ``c >= 0`` as at most two terms whose sum
    modulo ``2**width`` is the product: a shifted copy of ``x`` per set bit of ``c``, reduced by
    :func:`csa_reduce` (LUTs only, no DSP and no carry chain; the caller adds the two)."""
    x = Value.cast(x).as_unsigned()
    return csa_reduce(m, [x << i for i in range(c.bit_length()) if c >> i & 1] or [Const(0, 1)], width, name)


def csa_sum(m, terms, width: int, name: str) -> Value:
    """Sum of ``terms`` modulo ``2**width`` (exact where the sum fits ``width`` bits, signed or
    unsigned; the result is unsigned, ``.as_signed()`` it for signed sums): :func:`csa_reduce`
    to two terms, which one carry chain adds."""
    terms = csa_reduce(m, terms, width, name)
    return (terms[0] + terms[1])[:width] if len(terms) == 2 else terms[0]


def split_add(m, terms, width: int, name: str, ce=1) -> Value:
    """:func:`csa_sum` with one register inside: the terms reduced to two and their low halves
    added, the carry and the high halves registered (when ``ce``: in a stall-all pipeline); the
    returned value adds the high halves with that carry, combinationally, a cycle after the
    terms. Two carry chains of ``width / 2``, one each side of the register, instead of one of
    ``width``."""
    terms = csa_reduce(m, terms, width, name)
    a, b = (terms + [Const(0, width)])[:2]
    half = width // 2
    lo = Signal(half + 1, name=f"{name}_lo")
    a_hi, b_hi = Signal(width - half, name=f"{name}_a_hi"), Signal(width - half, name=f"{name}_b_hi")
    with m.If(ce):
        m.d.sync += [lo.eq(a[:half] + b[:half]), a_hi.eq(a[half:]), b_hi.eq(b[half:])]
    return Cat(lo[:half], a_hi + b_hi + lo[half])[:width]


def split_sum(m, terms, width: int, name: str) -> Signal:
    """:func:`split_add` with its result registered too: the sum modulo ``2**width`` in a register
    two cycles after the terms."""
    out = Signal(width, name=name)
    m.d.sync += out.eq(split_add(m, terms, width, name))
    return out


def greater(a: Value, b: Value, chunk: int = 24, m=None, name: str = "greater") -> Value:
    """``a > b`` for unsigned ``a``, ``b`` as carry chains of ``chunk`` bits side by side (each
    chunk's compare and equality at once, then a few LUTs), not one chain over the full width.
    Given ``m``, each chunk's compare and equality are registered (the chains end at flip-flops)
    and the verdict, of ``a`` and ``b`` one cycle earlier, is the LUTs after them."""
    a, b = Value.cast(a), Value.cast(b)
    width = max(len(a), len(b))
    a, b = extend(a, width), extend(b, width)
    result = Const(0, 1)
    for lo in range(0, width, chunk):   # from the low chunk up: a higher chunk decides unless equal
        hi = min(width, lo + chunk)
        above, equal = a[lo:hi] > b[lo:hi], a[lo:hi] == b[lo:hi]
        if m is not None:
            above, equal = delayed(m, above, f"{name}_above{lo // chunk}"), delayed(m, equal, f"{name}_equal{lo // chunk}")
        result = above | (equal & result)
    return result


SCALED_STAGES = 3   # registered stages of scaled_round


def scaled_round(m, value: Value, scale: int, shift: int, shape, name: str, ce=1) -> Signal:
    """``saturate(round_shift(value * scale, shift), shape)`` (arith's rounding) in
    ``SCALED_STAGES`` registered stages, each loaded when ``ce`` (always by default: a pipeline
    that never stalls): the partial products of ``value * scale`` (DSPs); their sum with the
    rounding half; the shift and the saturation. The result of ``value`` at the ``c``-th cycle
    with ``ce`` is in the returned register ``SCALED_STAGES`` such cycles later."""
    pieces = register_partials(m, ce, partial_products(value, scale), f"{name}_p")
    width = len(value) + scale.bit_length() + 2
    half = (1 << (shift - 1)) if shift > 0 else 0
    total = Signal(signed(width), name=f"{name}_sum")
    out = Signal(shape, name=name)
    total_next = csa_sum(m, placed(pieces) + [Const(half, width)], width, f"{name}_sum")
    with m.If(ce):
        m.d.sync += [total.eq(total_next.as_signed()),
                     out.eq(saturate(total >> shift if shift >= 0 else total << -shift, shape))]
    return out
