"""cocotb: the MAC unit top (hdl/mac/unit.py: Match and Merge behind stream ports) ==
golden.mac_unit, both halves at once: tb_mac_match's query sequence on ``match_query`` /
``match_result`` and tb_mac_merge's merge and removal cases on ``merge_in`` / ``merge_out``
(``vectors`` of each; ``trace``: real SmolLM2 queries and states). Random gaps on both
inputs, back-pressure on both outputs, the two halves interleaved in time."""
from __future__ import annotations

import cocotb

from golden.mac_unit import MacUnitConfig
from hdl.mac.match import match_query_layout, match_result_layout
from hdl.mac.merge import merge_in_layout, merge_out_layout
from testbenches.streams import Bench
from testbenches.tb.tb_mac_match import expect_matches, match_report, match_timeout, queries_of
from testbenches.tb.tb_mac_merge import cases_of, expect_merges, merge_report, merge_timeout


@cocotb.test()
async def mac_unit_matches_golden(dut):
    bench = await Bench.start(dut, MacUnitConfig)
    cfg = bench.cfg
    query, result = bench.source("match_query", match_query_layout(cfg)), bench.sink("match_result", match_result_layout(cfg))
    merge_in, merge_out = bench.source("merge_in", merge_in_layout(cfg)), bench.sink("merge_out", merge_out_layout(cfg))
    queries, cases = queries_of(bench), cases_of(bench)
    matches = expect_matches(cfg, queries, query, result)
    merges, flagged = expect_merges(cfg, cases, merge_in, merge_out)
    await bench.drain(timeout_cycles=match_timeout(cfg, queries) + merge_timeout(len(merges)))
    bench.finish(vectors=len(queries) + len(cases), matches=len(queries), merges=len(cases),
                 **match_report(cfg, matches, result), **merge_report(merges, flagged, merge_out))
