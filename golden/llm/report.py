"""Where an evaluation writes: ``--out`` (results JSON) and ``--plot`` (a folder of PNGs),
checked before the (slow) run so that a bad path fails first, not last."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError


def _writable_folder(folder: Path, flag: str, given: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag} {given}: cannot create {folder} ({err.strerror or err})") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{flag} {given}: folder {folder} is not writable")


def check_outputs(out: Path | None, plot_dir: Path | None) -> None:
    """ConfigError when the JSON file or the plot folder could not be written."""
    if out is not None:
        out = Path(out)
        if out.is_dir():
            raise ConfigError(f"--out {out} is a directory (give a file name)")
        _writable_folder(out.parent if str(out.parent) else Path("."), "--out", out)
    if plot_dir is not None:
        plot_dir = Path(plot_dir)
        if plot_dir.exists() and not plot_dir.is_dir():
            raise ConfigError(f"--plot {plot_dir} is not a folder")
        _writable_folder(plot_dir, "--plot", plot_dir)


def write_json(out: Path, results: dict) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
