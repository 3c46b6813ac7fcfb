"""Compare each sampled mutant's outcome at today's bench with its block's committed record (session 76)."""
import json
recs = {"vpu": "vpu-s72", "sfm": "sfm-s74", "sram": "sram-s72", "mac-match": "mac-match-s74", "lad-apid": "lad-apid-s72", "lad-md": "lad-md-s75", "mac-decode": "mac-decode-s73", "mac-merge": "mac-merge-s54", "dense": "dense-s58", "lad-eas": "lad-eas-s60b", "lad-ac": "lad-ac-s66", "lad-tile": "lad-tile-s69"}
key = lambda m: (m["file"], m["line"], m["operator"], m["before"], m["after"])
for b, r in recs.items():
    try:
        new = json.load(open(f"benchmarks/results/mutation-sample-s76/{b}.json"))
    except FileNotFoundError:
        print(b, "not run"); continue
    old = {key(m): m["outcome"] for m in json.load(open(f"benchmarks/results/mutation-{r}.json"))["mutants"]}
    rows = [(m["outcome"], old.get(key(m), "NOT IN RECORD"), f'{m["file"]}:{m["line"]} {m["operator"]}') for m in new["mutants"] if m["outcome"]]
    same = sum(n.split()[0] == o.split()[0] for n, o, _ in rows)
    print(f"{b}: {len(rows)} sampled (seed {new['seed']}), {same} same outcome as {r}")
    for n, o, w in rows:
        if n.split()[0] != o.split()[0]:
            print("   differs:", w, "now", n, "recorded", o)
