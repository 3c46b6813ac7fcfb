"""MacUnit top: the Match unit and the Merge unit side by side behind stream ports
(docs/algorithms.md §2). The decode controller outside the unit sends each new pre-RoPE
query to ``match_query``, reads the decision from ``match_result``, and on a hit sends
the prefix/band/tail states through ``merge_in`` (⊕) and the cache downdate (⊖)."""
from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from golden.mac_unit import MacUnitConfig

from .match import MatchUnit, match_query_layout, match_result_layout
from .merge import MergeUnit, merge_in_layout, merge_out_layout


class MacUnit(wiring.Component):
    def __init__(self, cfg: MacUnitConfig):
        self.cfg = cfg
        super().__init__({
            "match_query": In(stream.Signature(match_query_layout(cfg))),
            "match_result": Out(stream.Signature(match_result_layout(cfg))),
            "merge_in": In(stream.Signature(merge_in_layout(cfg))),
            "merge_out": Out(stream.Signature(merge_out_layout(cfg))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.match = match = MatchUnit(self.cfg)
        m.submodules.merge = merge = MergeUnit(self.cfg)
        wiring.connect(m, wiring.flipped(self.match_query), match.query)
        wiring.connect(m, match.result, wiring.flipped(self.match_result))
        wiring.connect(m, wiring.flipped(self.merge_in), merge.i)
        wiring.connect(m, merge.o, wiring.flipped(self.merge_out))
        return m
