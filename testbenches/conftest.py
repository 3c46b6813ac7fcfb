"""Shared pytest set-up of the testbenches."""
from __future__ import annotations

import os

import torch


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one torch thread per xdist worker (and in the simulations and commands it starts): the
        # workers already fill the cores, and two threads each on a 2-core machine only contend
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
