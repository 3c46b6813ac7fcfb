"""Shared pytest set-up of the testbenches.

Every Verilog generation in a test session goes through :func:`testbenches.runner.generate_verilog`,
which holds a lock per (block, config): the CLI tests (``ladmac verilog`` / ``ladmac sim`` in
test_cli.py, test_fuzz.py) and the Verilator benches often need the same Verilog (every block at its
defaults; the LAD tile's takes minutes), and pytest-xdist's workers would otherwise convert it at the
same time, once each, before either had written the cache."""
from __future__ import annotations

import hdl.registry
from testbenches import runner


def pytest_configure(config):
    hdl.registry.generate_verilog = runner.generate_verilog
