"""cocotb: the MAC unit top (hdl/mac/unit.py: Match and Merge behind stream ports) ==
golden.mac_unit, both halves at once: tb_mac_match's query sequence on ``match_query`` /
``match_result`` and tb_mac_merge's merge and removal cases on ``merge_in`` / ``merge_out``
(``vectors`` of each; ``trace``: real SmolLM2 queries and states). Random gaps on both
inputs, back-pressure on both outputs, the two halves interleaved in time."""
from __future__ import annotations

import cocotb

from golden.mac_unit import MacUnitConfig
from testbenches.streams import Bench
from testbenches.tb.tb_mac_match import match_half
from testbenches.tb.tb_mac_merge import merge_half


@cocotb.test()
async def mac_unit_matches_golden(dut):
    bench = await Bench.start(dut, MacUnitConfig)
    match_timeout, match_report = match_half(bench, "match_query", "match_result")
    merge_timeout, merge_report = merge_half(bench, "merge_in", "merge_out")
    await bench.drain(timeout_cycles=match_timeout + merge_timeout)
    match, merge = match_report(), merge_report()
    matches, merges = match.pop("vectors"), merge.pop("vectors")
    bench.finish(vectors=matches + merges, matches=matches, merges=merges, **match, **merge)
