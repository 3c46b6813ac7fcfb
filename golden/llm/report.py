"""Where an evaluation writes: ``--out`` (results JSON), ``--plot`` (a folder of PNGs) and files such
as ``--activity``, checked before the (slow) run so that a bad path fails first, not last."""
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


def check_outputs(out: Path | None, plot_dir: Path | None, **files: Path | None) -> None:
    """ConfigError when the JSON file, the plot folder or another file named by its flag
    (``activity=PATH`` for ``--activity``) could not be written."""
    for flag, path in {"out": out, **files}.items():
        if path is not None:
            path = Path(path)
            if path.is_dir():
                raise ConfigError(f"--{flag} {path} is a directory (give a file name)")
            _writable_folder(path.parent if str(path.parent) else Path("."), f"--{flag}", path)
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


def save_outputs(result: dict, args, plots) -> None:
    """An evaluation's ending: ``plots(result, folder)`` into ``--plot`` (their paths kept in the
    result and printed) and the result's JSON into ``--out``, each when asked for."""
    if args.plot:
        result["plots"] = plots(result, args.plot)
        print("plots: " + ", ".join(map(str, result["plots"])))
    if args.out:
        write_json(args.out, result)
