"""Verilog of a block at a config (docs/architecture.md, "Verilog generation"): the registry's
component converted with its large parts apart and in parallel (:mod:`hdl.lib.parts`), optionally
linted, and cached on disk under build/verilog-cache, one generation per (block, config) at a time
across every process of the checkout (the CLI, pytest-xdist's workers, the benches)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from golden.paths import BUILD_ROOT

from .lib.parts import collecting, convert_parts, port_stub
from .lib.verilog import lint_result, lint_verilog, to_verilog
from .registry import get_block


@contextmanager
def build_lock(name: str):
    """An exclusive lock ``build/locks/NAME.lock`` shared by every process of the checkout;
    released when the block ends or the process dies."""
    path = BUILD_ROOT / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _source_digest() -> str:
    """Hash of the generator's own sources (hdl/ and golden/): a changed file invalidates caches."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha1()
    for path in sorted([*root.glob("hdl/**/*.py"), *root.glob("golden/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def generate_verilog(name: str, cfg, cache: bool = True, lint: bool = False) -> str:
    """Verilog text of block ``name`` at ``cfg``; the top module is called ``top``. With ``lint``,
    the text passed ``verilator --lint-only`` (a raised error otherwise).

    Conversion runs Yosys (WebAssembly) and takes seconds for the larger blocks, so the text is
    cached by (block, config, generator sources), and a second process asking for the same
    Verilog waits for the first's entry instead of converting it again; a ``.lint-ok`` file
    beside an entry records that it was linted. ``cache=False`` converts afresh and keeps nothing."""
    if not cache:
        return _convert(name, cfg, lint)
    path = BUILD_ROOT / "verilog-cache" / f"{name}-{cfg.key()}-{_source_digest()}.v"
    linted = path.with_suffix(".lint-ok")
    with build_lock(f"verilog-{name}-{cfg.key()}"):
        if path.exists():
            if lint and not linted.exists():
                lint_verilog(path)
                linted.touch()
            return path.read_text()
        text = _convert(name, cfg, lint)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if lint:
            linted.touch()
        return text


def _convert(name: str, cfg, lint: bool) -> str:
    """The block's Verilog: the parts it adds with :func:`hdl.lib.parts.add_part` (the LAD tile's
    EAS, APID, MD, AC, SFM, exact pass) converted and linted apart, in parallel; the rest (the
    top) linted against their port stubs meanwhile."""
    component = get_block(name).build(cfg)
    with collecting() as parts:
        text = to_verilog(component, "top")
    with tempfile.TemporaryDirectory(prefix="ladmac-lint-") as tmp:
        top_lint = None
        if lint:
            stubbed = Path(tmp) / "top.v"
            stubbed.write_text(text + "".join(port_stub(part, c) for part, c in parts.items()))
            top_lint = lint_verilog(stubbed, wait=False)
        try:
            text = "".join([text, *convert_parts(parts, lint=lint)])
        except BaseException:
            if top_lint is not None:
                top_lint.kill()
            raise
        if top_lint is not None:
            lint_result(top_lint, stubbed)
    return text
