"""Register harness: puts any block on a real board's pins with every core port registered.

``SerialHarness`` wraps a core ``wiring.Component`` of any width behind a handful of pins:

* inputs: one flat register ``x`` holding every core input bit (all input ports of the
  signature, in flatten order). While ``shift`` is high it shifts ``len(din)`` bits a
  cycle in from ``din``; the core reads ``x`` directly, so every core input is a flip-flop.
* outputs: every core output bit is registered each cycle into ``y`` (registered outputs);
  while ``capture`` is high a second register ``z`` (``y`` zero-extended to whole beats)
  loads ``y``, otherwise ``z`` shifts ``len(dout)`` bits a cycle out to ``dout``, top beat
  first. Every output bit is observable at a pin, so
  Yosys cannot remove any of the core's logic.

``BoardTop`` places that on the ULX3S: the 25 MHz board clock feeds an ECP5 PLL
(EHXPLLL) set to the target frequency, the PLL lock releases a synchronised reset, and
``din``/``shift``/``capture``/``dout`` sit on pins of the board's ``gpio`` connector. The
PLL output clock then carries a derived constraint and nextpnr reports Fmax for it. The
synchronised reset reaches the design's flip-flops over a global network (a DCCA buffer, as a
board design would distribute a reset of thousands of loads): nextpnr promotes only clocks
itself, and through fabric routing the reset of mac-unit's ~10k flip-flops took 13.2 ns.
"""
from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Const, Elaboratable, Instance, Module, ResetSignal, Signal, Value
from amaranth.build import Attrs, Pins, Resource
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from golden.errors import ConfigError

DIN_PINS = 8      # serial input lanes
DOUT_PINS = 8     # serial output lanes
BOARD_CLOCK_MHZ = 25.0
CORE_NAME = "core"  # submodule name of the core inside the harness


def port_bits(component: wiring.Component) -> tuple[list, list]:
    """``(inputs, outputs)``: lists of ``(path, width, value)`` of the core's ports."""
    ins, outs = [], []
    for path, member, value in component.signature.flatten(component):
        value = Value.cast(value)
        entry = (".".join(str(p) for p in path), len(value), value)
        (ins if member.flow == wiring.In else outs).append(entry)
    return ins, outs


def chain_lengths(in_bits: int, out_bits: int, din: int = DIN_PINS, dout: int = DOUT_PINS) -> dict:
    """Cycles needed to shift a full input word in and a full output word out."""
    return {"in_bits": in_bits, "out_bits": out_bits,
            "load_cycles": -(-in_bits // din) if in_bits else 0,
            "unload_cycles": -(-out_bits // dout) if out_bits else 0}


def harness_ff_count(in_bits: int, out_bits: int) -> int:
    """Flip-flops the harness itself adds around the core (exact by construction)."""
    # x chain, y register, z chain (whole beats), pin registers (din, shift, capture, dout),
    # 2 reset-synchroniser stages
    z_bits = -(-out_bits // DOUT_PINS) * DOUT_PINS
    return in_bits + out_bits + z_bits + DIN_PINS + 2 + DOUT_PINS + 2


class SerialHarness(wiring.Component):
    """Core with registered, serialised ports (see the module docstring)."""

    def __init__(self, core: wiring.Component, din_pins: int = DIN_PINS, dout_pins: int = DOUT_PINS):
        self.core = core
        self.ins, self.outs = port_bits(core)
        self.in_bits = sum(w for _, w, _ in self.ins)
        self.out_bits = sum(w for _, w, _ in self.outs)
        if self.out_bits == 0:
            raise ConfigError("block has no output ports: nothing to observe, synthesis would remove it")
        super().__init__({"din": In(din_pins), "shift": In(1), "capture": In(1), "dout": Out(dout_pins)})

    def elaborate(self, platform):
        m = Module()
        m.submodules[CORE_NAME] = self.core
        k_in, k_out = len(self.din), len(self.dout)

        if self.in_bits:
            x = Signal(self.in_bits, name="x_chain")
            with m.If(self.shift):
                if self.in_bits <= k_in:
                    m.d.sync += x.eq(self.din[:self.in_bits])
                else:
                    m.d.sync += x.eq(Cat(self.din, x[:self.in_bits - k_in]))
            offset = 0
            for _, width, value in self.ins:
                m.d.comb += value.eq(x[offset:offset + width])
                offset += width

        y = Signal(self.out_bits, name="y_reg")
        m.d.sync += y.eq(Cat(*[value for _, _, value in self.outs]))
        z_bits = -(-self.out_bits // k_out) * k_out  # whole beats: dout shows y top beat first
        z = Signal(z_bits, name="z_chain")
        with m.If(self.capture):
            m.d.sync += z.eq(y)
        with m.Else():
            m.d.sync += z.eq(Cat(Const(0, k_out), z[:z_bits - k_out]))
        m.d.comb += self.dout.eq(z[z_bits - k_out:])
        return m


def pll_params(f_in: float, f_out: float) -> dict:
    """EHXPLLL dividers for ``f_out`` MHz from ``f_in`` MHz (VCO 400..800 MHz, PFD >= 3.125 MHz),
    closest achievable output first; raises ConfigError if nothing is within 1%."""
    best = None
    for clki in range(1, 129):
        pfd = f_in / clki
        if not 3.125 <= pfd <= 400:
            continue
        for fb in range(1, 81):
            out = pfd * fb
            for op in range(1, 129):
                vco = out * op
                if not 400 <= vco <= 800:
                    continue
                err = abs(out - f_out)
                score = (round(err, 6), abs(vco - 600.0))  # exact first, then a mid-range VCO
                if best is None or score < best[0]:
                    best = (score, clki, fb, op, out, vco)
    if best is None or best[0][0] > 0.01 * f_out:
        raise ConfigError(f"no ECP5 PLL setting makes {f_out} MHz from the {f_in} MHz board clock")
    _, clki, fb, op, out, vco = best
    return {"CLKI_DIV": clki, "CLKFB_DIV": fb, "CLKOP_DIV": op, "CLKOP_CPHASE": (op - 1) // 2,
            "f_out": out, "f_vco": vco}


HARNESS_RESOURCES = [
    # Pins on the ULX3S `gpio` connector (the 2x28 header): 8 data in, shift, capture, 8 data out.
    Resource("harness_din", 0, Pins("0+ 0- 1+ 1- 2+ 2- 3+ 3-", dir="i", conn=("gpio", 0)),
             Attrs(IO_TYPE="LVCMOS33")),
    Resource("harness_ctl", 0, Pins("4+ 4-", dir="i", conn=("gpio", 0)), Attrs(IO_TYPE="LVCMOS33")),
    Resource("harness_dout", 0, Pins("5+ 5- 6+ 6- 7+ 7- 8+ 8-", dir="o", conn=("gpio", 0)),
             Attrs(IO_TYPE="LVCMOS33", DRIVE="4")),
]


class BoardTop(Elaboratable):
    """Top level for the board: PLL clock, reset from PLL lock, harness on gpio pins."""

    def __init__(self, core: wiring.Component, freq_mhz: float = 100.0):
        self.harness = SerialHarness(core)
        self.freq_mhz = freq_mhz
        self.pll = pll_params(BOARD_CLOCK_MHZ, freq_mhz)

    def elaborate(self, platform):
        m = Module()
        platform.add_resources(HARNESS_RESOURCES)
        clk_port = platform.request(platform.default_clk, dir="-")
        m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_port)
        clk, lock = Signal(name="pll_clk"), Signal(name="pll_lock")
        p = self.pll
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(BOARD_CLOCK_MHZ), a_FREQUENCY_PIN_CLKOP=f"{p['f_out']:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=p["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=p["CLKOP_DIV"],
            p_CLKOP_CPHASE=p["CLKOP_CPHASE"], p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            p_CLKFB_DIV=p["CLKFB_DIV"],
            i_RST=0, i_STDBY=0, i_CLKI=clk_buf.i, o_CLKOP=clk, i_CLKFB=clk,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=lock)
        m.domains.sync = ClockDomain("sync")
        m.domains.reset_sync = ClockDomain("reset_sync")   # the synchroniser's own flip-flops
        m.d.comb += [ClockSignal("sync").eq(clk), ClockSignal("reset_sync").eq(clk)]
        m.submodules.reset_sync = ResetSynchronizer(~lock, domain="reset_sync")
        m.submodules.reset_global = Instance("DCCA", i_CLKI=ResetSignal("reset_sync"), i_CE=Const(1),
                                             o_CLKO=ResetSignal("sync"))

        h = self.harness
        m.submodules.harness = h
        din = io.Buffer("i", platform.request("harness_din", 0, dir="-"))
        ctl = io.Buffer("i", platform.request("harness_ctl", 0, dir="-"))
        dout = io.Buffer("o", platform.request("harness_dout", 0, dir="-"))
        m.submodules += [din, ctl, dout]
        # pin registers: the pad-to-chain and chain-to-pad paths are one flip-flop each
        din_r, ctl_r, dout_r = Signal(len(h.din)), Signal(2), Signal(len(h.dout))
        m.d.sync += [din_r.eq(din.i), ctl_r.eq(ctl.i), dout_r.eq(h.dout)]
        m.d.comb += [h.din.eq(din_r), h.shift.eq(ctl_r[0]), h.capture.eq(ctl_r[1]), dout.o.eq(dout_r)]
        return m
