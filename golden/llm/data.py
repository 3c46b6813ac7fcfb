"""Evaluation text for the decoding runs: WikiText-2 test (``data/wikitext2/test.txt``, checked
against ``data/SHA256SUMS`` by :func:`golden.paths.data_file`; ``--data`` may name another copy)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from ..paths import data_file

WIKITEXT = "wikitext2/test.txt"


def wikitext_path(path: Path | None = None) -> Path:
    """``path``, or the repository's verified copy of WikiText-2 test."""
    return Path(path) if path is not None else data_file(WIKITEXT)


def read_wikitext(path: Path | None = None) -> str:
    """The text of WikiText-2 test (``path`` or the repository's copy); :class:`DataError` when the
    file is missing, unreadable, not UTF-8, binary or too short. Needs no model: the CLI checks it first."""
    path = wikitext_path(path)
    if not path.exists():
        raise DataError(f"WikiText-2 file not found: {path}")
    if not path.is_file():
        raise DataError(f"WikiText-2 file {path} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"WikiText-2 file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"cannot read WikiText-2 file {path}: {err.strerror or err}") from None
    if "\x00" in text[:100000] or len(text.split()) < 100:
        raise DataError(f"WikiText-2 file {path} is malformed (empty, binary or under 100 words)")
    return text


def wikitext_ids(tokenizer, need: int, path: Path | None = None, text: str | None = None) -> torch.Tensor:
    """The first ``need`` token ids of WikiText-2 test (1-D); ``text`` skips re-reading the file."""
    if text is None:
        text = read_wikitext(path)
    chars = max(20000, need * 8)
    ids = tokenizer(text[:chars], return_tensors="pt").input_ids[0]
    if ids.numel() < need:
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if ids.numel() < need:
        raise DataError(f"WikiText-2 file {wikitext_path(path)} has {ids.numel()} tokens, {need} needed")
    return ids[:need]
