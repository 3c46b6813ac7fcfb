"""Shared pytest set-up of the testbenches."""
from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one torch thread per xdist worker (and in the simulations and commands it starts): the
        # workers already fill the cores, and two threads each on a 2-core machine only contend
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M with a LAD/MAC :class:`golden.llm.hooks.Controller` attached, one torch thread,
    and the first 2113 WikiText-2 test tokens; detached (the model's attention restored) after."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from golden.llm.data import wikitext_ids
    from golden.llm.hooks import Controller, controller_of
    from golden.llm.runs import load_model
    model, tokenizer = load_model()
    before = model.config._attn_implementation
    ctl = Controller(model)
    assert model.config._attn_implementation == ctl.name != before
    ids = wikitext_ids(tokenizer, 2048 + 64 + 1)
    yield ctl, ids
    ctl.detach()
    assert model.config._attn_implementation == before and controller_of(model) is None
    torch.set_num_threads(threads)
