"""SRAM bank: config and reference model (the memory the LAD tile and MAC unit keep
their caches, centers, ring windows and per-position metadata in).

One write port and ``read_ports`` read ports. A read returns the word as it was
before any write in the same cycle (read-before-write), ``read_latency`` cycles after
the request is accepted when the response stream is not stalled.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import BlockConfig, param


@dataclass(frozen=True)
class SramConfig(BlockConfig):
    depth: int = param(256, "words")
    width: int = param(32, "bits per word")
    read_ports: int = param(1, "independent read ports (request/response streams)")
    read_latency: int = param(2, "cycles from accepted request to response (1..6); from 2 the read data is "
                                 "registered (the block RAM's output register)")
    address_register: bool = param(False, "read address from a register: a fixed-latency read into an output FIFO "
                                          "(read_latency >= 4)")

    def validate(self):
        self.require(2 <= self.depth <= 1 << 20, f"depth must be 2..{1 << 20}, got {self.depth}")
        self.require(1 <= self.width <= 1024, f"width must be 1..1024, got {self.width}")
        self.require(1 <= self.read_ports <= 4, f"read_ports must be 1..4, got {self.read_ports}")
        self.require(1 <= self.read_latency <= 6, f"read_latency must be 1..6, got {self.read_latency}")
        self.require(not self.address_register or self.read_latency >= 4,
                     f"address_register needs read_latency >= 4, got {self.read_latency}")

    @property
    def addr_width(self) -> int:
        return max(1, (self.depth - 1).bit_length())

    @property
    def bits(self) -> int:
        return self.depth * self.width


PRESETS = {
    "default": SramConfig(),
    # the read data straight from the RAM (the LAD tile's AC caches, the MAC decode's states)
    "unregistered": SramConfig(read_ports=2, read_latency=1),
    "dual": SramConfig(depth=100, width=20, read_ports=2, read_latency=2),
    "deep": SramConfig(depth=4096, width=64, read_ports=1, read_latency=3),
    # five block-RAM banks of 1024 x 18 (the last one 904 words): the bank select after the
    # tiles' registers
    "banked": SramConfig(depth=5000, width=18, read_ports=2, read_latency=2),
    # five banks of 2048 x 9 selected by a registered mux tree: groups of four, then the two groups
    "tree": SramConfig(depth=9000, width=9, read_ports=2, read_latency=4),
    # the same with the read address from a register: a fixed-latency read into an output FIFO
    "registered-address": SramConfig(depth=9000, width=9, read_ports=2, read_latency=5, address_register=True),
    # one bank of three 2048 x 9 tiles, its address registered: the fewest stages (4)
    "registered-address-one-bank": SramConfig(depth=2048, width=20, read_ports=1, read_latency=4,
                                              address_register=True),
}


class SramModel:
    """Reference behaviour: replay transfers in cycle order (reads see writes of earlier cycles)."""

    def __init__(self, cfg: SramConfig):
        self.cfg = cfg
        self.words = [0] * cfg.depth

    def replay(self, writes: list[tuple[int, int, int]], reads: list[tuple[int, int]]) -> list[int]:
        """``writes``: (cycle, addr, data); ``reads``: (cycle, addr) of one port, in order.
        Returns the data each read must return."""
        self.words = [0] * self.cfg.depth
        events = sorted([(c, 1, a, d) for c, a, d in writes] + [(c, 0, a, i) for i, (c, a) in enumerate(reads)])
        out = [0] * len(reads)
        for _, is_write, addr, x in events:  # same cycle: read (0) sorts before write (1)
            if is_write:
                self.words[addr] = x & ((1 << self.cfg.width) - 1)
            else:
                out[x] = self.words[addr]
        return out
