"""Evaluation text for the decoding runs: WikiText-2 test (``data/wikitext2/test.txt``, checked
against ``data/SHA256SUMS`` by :func:`golden.paths.data_file`); ``--data`` may name another text
file, which the run's table and JSON then name by its path (:func:`describe_text`)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from ..paths import DATA_ROOT, data_file, describe_data_file

WIKITEXT = "wikitext2/test.txt"


def wikitext_path(path: Path | None = None) -> Path:
    """``path``, or the repository's verified copy of WikiText-2 test."""
    return Path(path) if path is not None else data_file(WIKITEXT)


def describe_text(path: Path | None = None) -> str:
    """How a run names the text it reads: ``WikiText-2 test (PATH)`` for the repository's copy (the
    default, or ``--data`` naming that same file), otherwise only the path of the file given."""
    return describe_data_file(DATA_ROOT / WIKITEXT if path is None else path, WIKITEXT, "WikiText-2 test")


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


# ----------------------------------------------------------------------------- MMLU
MMLU = "mmlu"  # data/mmlu/{dev,test}/<subject>_{dev,test}.csv (Hendrycks et al.; dev = the 5 exemplars)
MMLU_CHOICES = ("A", "B", "C", "D")


def mmlu_subjects(root: Path | None = None) -> list[str]:
    """Subjects with both a dev and a test file under ``root`` (default ``data/mmlu``), sorted."""
    root = Path(root) if root is not None else DATA_ROOT / MMLU
    if not (root / "test").is_dir() or not (root / "dev").is_dir():
        raise DataError(f"MMLU folder {root} lacks dev/ and test/")
    subjects = sorted(p.name[:-len("_test.csv")] for p in (root / "test").glob("*_test.csv")
                      if (root / "dev" / (p.name[:-len("_test.csv")] + "_dev.csv")).is_file())
    if not subjects:
        raise DataError(f"MMLU folder {root} holds no subject with both a dev and a test file")
    return subjects


def read_data_text(path, what: str) -> str:
    """A data file's UTF-8 text; :class:`DataError` naming ``what`` and the file when it is missing
    or unreadable (the loaders of MMLU, STS-B and SST-2 share it)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{what} file {path} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {what} file {path}: {err}") from None


def read_mmlu(path: Path) -> list[tuple[str, tuple[str, str, str, str], str]]:
    """An MMLU csv (``question,A,B,C,D,answer``, RFC-4180 quoting) -> [(question, choices, answer letter)];
    :class:`DataError` naming the file and line on a malformed row."""
    import csv
    path = Path(path)
    text = read_data_text(path, "MMLU")
    rows = []
    import io
    reader = csv.reader(io.StringIO(text, newline=""))  # not splitlines: questions hold U+0085 / U+2028
    for fields in reader:
        line = reader.line_num
        if not fields:
            continue
        if len(fields) != 6:
            raise DataError(f"{path}:{line}: expected 6 fields (question, A-D, answer), got {len(fields)}")
        if fields[5].strip() not in MMLU_CHOICES:
            raise DataError(f"{path}:{line}: answer '{fields[5]}' is not A, B, C or D")
        if not fields[0].strip():
            raise DataError(f"{path}:{line}: empty question")
        rows.append((fields[0], tuple(fields[1:5]), fields[5].strip()))
    if not rows:
        raise DataError(f"MMLU file {path} holds no question")
    return rows


def mmlu_example(question: str, choices, answer: str | None = None) -> str:
    """Hendrycks et al.'s format: question, ``\\nA. ...`` x4, ``\\nAnswer:`` (+ `` X\\n\\n`` for an exemplar)."""
    text = question + "".join(f"\n{c}. {t}" for c, t in zip(MMLU_CHOICES, choices)) + "\nAnswer:"
    return text if answer is None else text + f" {answer}\n\n"


def mmlu_prompts(subject: str, shots: int, root: Path | None = None):
    """(prefix, [(question text, answer letter)]) of one subject: prefix = the header line and the first
    ``shots`` dev exemplars (shared by every question of the subject), question text = the test question
    in the same format without its answer. The model's input is prefix + question text."""
    def path(split):  # the repository's copy is checked against data/SHA256SUMS
        rel = f"{split}/{subject}_{split}.csv"
        return Path(root) / rel if root is not None else data_file(f"{MMLU}/{rel}")
    dev = read_mmlu(path("dev"))
    if shots > len(dev):
        raise DataError(f"MMLU {subject}: {shots} shots asked, the dev file holds {len(dev)}")
    prefix = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    prefix += "".join(mmlu_example(q, c, a) for q, c, a in dev[:shots])
    test = read_mmlu(path("test"))
    return prefix, [(mmlu_example(q, c), a) for q, c, a in test]
