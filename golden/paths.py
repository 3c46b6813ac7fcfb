"""Where things live: the project root, the shared evaluation data, and caches."""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = Path(os.environ.get("LADMAC_DATA", PROJECT_ROOT.parent / "shared" / "data"))
CACHE_ROOT = Path(os.environ.get("LADMAC_CACHE", Path.home() / ".cache" / "ladmac"))
BUILD_ROOT = Path(os.environ.get("LADMAC_BUILD", PROJECT_ROOT / "build"))
