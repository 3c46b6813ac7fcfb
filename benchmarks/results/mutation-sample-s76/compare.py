"""Each sampled mutant's outcome at today's bench against its block's newest committed record
(session 76): ``.venv/bin/python benchmarks/results/mutation-sample-s76/compare.py``.

A mutant is matched by its file, line and text: the records' status is "bench changed" (the mutated
sources are the same as at the record), so its lines have not moved."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from testbenches.mutation import PROJECT_ROOT, is_kill, record_status  # noqa: E402


def verdict(outcome: str) -> str:
    return "killed" if is_kill(outcome) else outcome


def key(m: dict) -> tuple:
    return m["file"], m["line"], m["before"], m["after"]


for sample in sorted(Path(__file__).parent.glob("*.json")):
    new = json.loads(sample.read_text())
    status = record_status(new["block"])
    old = {key(m): m["outcome"] for m in json.loads((PROJECT_ROOT / status["record"]).read_text())["mutants"]}
    rows = [(verdict(m["outcome"]), verdict(old.get(key(m), "not in the record")), m) for m in new["mutants"]]
    same = sum(n == o for n, o, _ in rows)
    print(f"{new['block']}: {len(rows)} sampled (seed {new['seed']}), {same} with the outcome recorded in "
          f"{status['record']} ({status['status']})")
    for n, o, m in rows:
        if n != o:
            print(f"   differs: {m['file']}:{m['line']} {m['operator']}: now {n}, recorded {o}")
