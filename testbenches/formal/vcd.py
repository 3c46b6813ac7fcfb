"""Print a counterexample trace (VCD from SymbiYosys) as a table of chosen signals per step."""
from __future__ import annotations

import re
import sys
from pathlib import Path


def read_vcd(path) -> tuple[dict[str, list[int]], int]:
    """Signal name (dotted scope path) -> value per step (clock rising edges), and the step count."""
    ids, names, values, changes = {}, {}, {}, []
    scope, time = [], 0
    text = Path(path).read_text()
    for line in text.splitlines():
        tok = line.split()
        if not tok:
            continue
        if tok[0] == "$scope":
            scope.append(tok[2])
        elif tok[0] == "$upscope":
            scope.pop()
        elif tok[0] == "$var":
            ids.setdefault(tok[3], []).append(".".join(scope[1:] + [tok[4]]))
        elif tok[0].startswith("#"):
            time = int(tok[0][1:])
        elif tok[0][0] in "01xz" and len(tok) == 1:
            changes.append((time, tok[0][1:], tok[0][0]))
        elif tok[0][0] == "b":
            changes.append((time, tok[1], tok[0][1:]))
    times = sorted({t for t, _, _ in changes})
    step_times = [t for t in times if t % 10 == 0] or times
    cur, table = {}, {}
    by_time = {}
    for t, ident, v in changes:
        by_time.setdefault(t, []).append((ident, v))
    for step, t in enumerate(step_times):
        for ident, v in by_time.get(t, []):
            cur[ident] = v
        for ident, v in cur.items():
            for name in ids.get(ident, []):
                table.setdefault(name, [None] * len(step_times))[step] = int(v.replace("x", "0").replace("z", "0"), 2)
    return table, len(step_times)


def show(path, patterns: list[str]) -> str:
    table, steps = read_vcd(path)
    rows = [n for n in sorted(table) if any(re.search(p, n) for p in patterns)]
    width = max((len(r) for r in rows), default=10)
    out = [f"{'step':<{width}} " + " ".join(f"{s:>6}" for s in range(steps))]
    for r in rows:
        out.append(f"{r:<{width}} " + " ".join(f"{v if v is not None else '-':>6}" for v in table[r]))
    return "\n".join(out)


if __name__ == "__main__":
    print(show(sys.argv[1], sys.argv[2:]))
