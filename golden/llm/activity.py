"""An attention engine's activity inside a model, as its bit-accurate model counted it during
``ladmac eval lad|mac --hardware --activity FILE``: for each layer and each window of decode steps,
the sums over the window's steps and the layer's query heads of every count the engine's model
reports for a step (LAD tile: candidates, actives, mode changes, centers, KV beats, schedule cycles;
MAC decode engine: hits, keys read, fallbacks, KV and entry-store bytes, engine cycles; both: the
dense baseline's cycles). Sums keep the counts exact; a reader divides by ``steps`` (and the
layer's ``heads``) for means. This is what a whole-model system view reads instead of assumed rates."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError

FORMAT = 1


def activity(layer_steps: list[dict], window: int, **meta) -> dict:
    """The activity record of a run's ``layer_steps`` (:attr:`golden.llm.hooks.Controller.layer_steps`:
    per decode step its ``context`` and each layer's counts) in windows of ``window`` steps."""
    windows = []
    for start in range(0, len(layer_steps), window):
        chunk = layer_steps[start:start + window]
        layers = sorted({layer for step in chunk for layer in step["layers"]})
        sums = []
        for layer in layers:
            total: dict = {}
            for step in chunk:
                for k, v in step["layers"][layer].items():
                    total[k] = total.get(k, 0) + v
            sums.append(total)
        windows.append({"first_context": chunk[0]["context"], "last_context": chunk[-1]["context"],
                        "steps": len(chunk), "layers": sums})
    return {"format": FORMAT, **meta, "window": window, "windows": windows}


def read_activity(path: Path) -> dict:
    """An activity record written by :func:`write_activity`; :class:`DataError` (one line) for a
    file that is missing, not JSON or not such a record."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"no activity record {path} (write one with `ladmac eval lad|mac --hardware "
                        f"--activity FILE`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} is not an activity record ({err})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not record.get("windows"):
        raise DataError(f"{path} is not an activity record of format {FORMAT}")
    return record
