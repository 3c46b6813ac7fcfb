"""The AttnCache evaluation's inputs (``ladmac eval attncache``, docs/results_attncache.md): the
STS-B dev, SST-2 dev and MMLU loaders and splits, how a run names the files it read, and the
store's folder."""
from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from pathlib import Path

from ..errors import ConfigError, DataError
from ..paths import DATA_ROOT
from .data import MMLU, read_data_text

STSB = "stsb/sts-dev.csv"
SST2 = "sst2/dev.tsv"


def describe_mmlu(subjects: list[str]) -> str:
    """The MMLU files a run reads: the dev (exemplars) and test (questions) file of each subject."""
    return (f"{(DATA_ROOT / MMLU).resolve()}/{{dev,test}}/SUBJECT_{{dev,test}}.csv (MMLU dev exemplars and test "
            f"questions) for {len(subjects)} subject(s): {', '.join(subjects)}")


def calib_test_split(held_out: list, args, what: str) -> tuple[list, list]:
    """(calibration, test): the first ``--calib`` held-out items choose theta, the test items
    follow them (the first ``--test`` of the rest, when given)."""
    calib, test = [], held_out
    if args.calib is not None:
        if not 2 <= args.calib <= len(held_out) - 2:
            raise ConfigError(f"--calib must be in 2..{len(held_out) - 2} (held-out {what}), got {args.calib}")
        calib, test = held_out[:args.calib], held_out[args.calib:]
    if args.test is not None:
        if args.test < 2:
            raise ConfigError(f"--test must be >= 2, got {args.test}")
        test = test[:args.test]
    return calib, test


def load_stsb(path) -> list[tuple[float, str, str]]:
    """STS-B rows ``genre file year id score s1 s2 [extra]``, split on tabs only -> (score, s1, s2)."""
    path = Path(path)
    text = read_data_text(path, "STS-B")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 7:
            raise DataError(f"{path}:{number}: expected at least 7 tab-separated fields, got {len(fields)}")
        try:
            score = float(fields[4])
        except ValueError:
            raise DataError(f"{path}:{number}: score '{fields[4]}' is not a number") from None
        if not (0.0 <= score <= 5.0) or math.isnan(score):
            raise DataError(f"{path}:{number}: score {score} outside 0..5")
        s1, s2 = fields[5].strip(), fields[6].strip()
        if not s1 or not s2:
            raise DataError(f"{path}:{number}: empty sentence")
        rows.append((score, s1, s2))
    if len(rows) < 4:
        raise DataError(f"STS-B file {path} holds {len(rows)} rows; need at least 4")
    return rows


def split_pairs(rows, n_train: int, n_test: int | None, seed: int):
    import numpy as np
    if not 1 <= n_train < len(rows):
        raise ConfigError(f"--train must be in 1..{len(rows) - 1} (STS-B pairs), got {n_train}")
    order = np.random.default_rng(seed).permutation(len(rows))
    train = [rows[i] for i in order[:n_train]]
    test = [rows[i] for i in order[n_train:]]
    if n_test is not None:
        if n_test < 2:
            raise ConfigError(f"--test must be >= 2, got {n_test}")
        test = test[:n_test]
    return train, test


def load_sst2(path) -> list[tuple[str, int]]:
    """GLUE SST-2 ``sentence<TAB>label`` with a header line -> (sentence, 0/1)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"SST-2 file {path} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read SST-2 file {path}: {err}") from None
    if not lines or lines[0].split("\t")[:2] != ["sentence", "label"]:
        raise DataError(f"{path}:1: expected the header 'sentence<TAB>label'")
    rows = []
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or fields[1].strip() not in ("0", "1") or not fields[0].strip():
            raise DataError(f"{path}:{number}: expected 'sentence<TAB>0|1'")
        rows.append((fields[0].strip(), int(fields[1])))
    if len(rows) < 4:
        raise DataError(f"SST-2 file {path} holds {len(rows)} rows; need at least 4")
    return rows


def mmlu_questions(tok, shots: int, subjects: list[str], limit: int | None, seed: int):
    """Per subject: (prefix text, prefix ids, [(question ids, answer letter)]); ``limit`` questions per
    subject from a seeded shuffle (all when None). Input ids = prefix ids + question ids (tokenized
    apart, so every question of a subject starts with exactly the same ids)."""
    import numpy as np
    import torch
    from .data import mmlu_prompts
    out = []
    for subject in subjects:
        prefix, items = mmlu_prompts(subject, shots)
        if limit is not None:
            order = np.random.default_rng(seed).permutation(len(items))[:limit]
            items = [items[i] for i in sorted(order)]
        pids = torch.tensor(tok(prefix).input_ids, dtype=torch.long)
        out.append((subject, prefix, pids, [(torch.tensor(tok(q).input_ids, dtype=torch.long), a) for q, a in items]))
    return out



@contextlib.contextmanager
def store_root(store: str | None, cache):
    """The store's folder (``--store``, or a temp folder removed afterwards); detaches ``cache`` on exit."""
    tmp = None
    root = Path(store) if store else Path(tmp := tempfile.mkdtemp(prefix="ladmac-attncache-"))
    try:
        yield root
    finally:
        cache.detach()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
