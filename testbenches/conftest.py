"""Shared pytest set-up of the testbenches.

Every Verilog generation in a test session goes through :func:`testbenches.runner.generate_verilog`,
which holds a lock per (block, config): the CLI tests (``ladmac verilog`` / ``ladmac sim`` in
test_cli.py, test_fuzz.py) and the Verilator benches often need the same Verilog (every block at its
defaults; the LAD tile's takes minutes), and pytest-xdist's workers would otherwise convert it at the
same time, once each, before either had written the cache."""
from __future__ import annotations

import os

import torch

import hdl.registry
from testbenches import runner


def pytest_configure(config):
    hdl.registry.generate_verilog = runner.generate_verilog
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one torch thread per xdist worker (and in the simulations and commands it starts): the
        # workers already fill the cores, and two threads each on a 2-core machine only contend
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
