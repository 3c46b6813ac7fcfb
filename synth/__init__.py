"""Synthesis flow for every block in hdl.registry.BLOCKS: register harness on the ULX3S 85F
(ECP5 LFE5U-85F, CABGA381, speed 6), YoWASP Yosys + nextpnr, parsed reports, a cache and
docs/synthesis.md. Entry points: ``synth.flow.synthesize`` and ``synth.cli.main``."""
