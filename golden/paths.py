"""Where things live: the project root, the evaluation data (``data/``), build outputs and caches.

Every reader of evaluation data goes through :func:`data_file`, which checks the file against
``data/SHA256SUMS`` the first time a process opens it. ``LADMAC_DATA`` points elsewhere (a
folder with the same layout and its own ``SHA256SUMS``)."""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from .errors import DataError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = Path(os.environ.get("LADMAC_DATA", PROJECT_ROOT / "data"))
CACHE_ROOT = Path(os.environ.get("LADMAC_CACHE", Path.home() / ".cache" / "ladmac"))
BUILD_ROOT = Path(os.environ.get("LADMAC_BUILD", PROJECT_ROOT / "build"))


@lru_cache(maxsize=None)
def _checksums(root: Path) -> dict[str, str]:
    sums = root / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(f"no checksum file {sums} (LADMAC_DATA must name a folder laid out like data/)")
    out = {}
    for line in sums.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.lstrip("*").strip()] = digest
    return out


@lru_cache(maxsize=None)
def _verified(root: Path, rel: str) -> Path:
    want = _checksums(root).get(rel)
    if want is None:
        raise DataError(f"{rel} is not listed in {root / 'SHA256SUMS'}")
    path = root / rel
    if not path.is_file():
        raise DataError(f"evaluation data file missing: {path}")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise DataError(f"{path} does not match its checksum in SHA256SUMS (corrupt or modified copy)")
    return path


def data_file(rel: str) -> Path:
    """Path of evaluation data file ``rel`` (e.g. ``"wikitext2/test.txt"``) under DATA_ROOT, verified
    against its SHA-256; :class:`DataError` (one line at the CLI) when missing or altered."""
    return _verified(DATA_ROOT, rel)


def describe_data_file(path, rel: str, name: str) -> str:
    """How a run names a data file it read: ``NAME (PATH)`` for the repository's copy of ``rel``
    (``"stsb/sts-dev.csv"``, ``"STS-B dev"``), otherwise only the path of the file given."""
    path = Path(path).resolve()
    return f"{name} ({path})" if path == (DATA_ROOT / rel).resolve() else str(path)
