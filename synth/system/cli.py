"""``ladmac system``: what the dense tile, the LAD tile and the MAC decode engine buy for a whole
model's decode step: tokens/s, energy per token (DRAM / SRAM / arithmetic / static), SRAM and
area, under both residency policies, per DRAM and context (docs/system.md).

    ladmac system [--model smollm2|llama2-7b|CONFIG.json] [--contexts 2048,4096]
                  [--dram ddr4-3200,hbm2e] [--tiles N] [--residency resident,streamed]
                  [--node NM] [--clock MHZ] [--sram-budget MIB] [--activity FILE ...]
                  [--out JSON] [--plot DIR] [--lad-table3]

Activity comes from the recorded bit-accurate runs in benchmarks/results (``activity-ENGINE-
CONTEXT.json``) or ``--activity`` files. Bad input prints one line and returns 2."""
from __future__ import annotations

from pathlib import Path

from golden.cli import AtLeast, Parser
from golden.errors import ConfigError
from golden.llm.activity import read_activity

from .engines import ENGINES, dense_engine, lad_engine, load_record, mac_engine
from .model import RESIDENCY, decode_step, default_tiles, tiles_in_budget
from .shapes import SHAPES, get_shape
from .tech import Tech


DEFAULT_CONTEXTS = "2048,4096,8192"   # the contexts every engine has a repository activity record of


def _list(text: str, what: str, known=None, kind=str) -> list:
    try:
        items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--{what} expects a comma-separated list, got '{text}'") from None
    if not items:
        raise ConfigError(f"--{what} is empty")
    bad = [x for x in items if known is not None and x not in known]
    if bad:
        raise ConfigError(f"unknown {what} '{bad[0]}' (known: {', '.join(known)})")
    return items


def parser() -> Parser:
    ap = Parser(prog="ladmac system", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), llama2-7b or a transformers config.json")
    ap.add_argument("--contexts", default=DEFAULT_CONTEXTS, help="context lengths (each needs activity records)")
    ap.add_argument("--dram", default="ddr4-3200,hbm2e", help="DRAM standards (ddr4-3200, lpddr5-6400, hbm2e)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="attention engines (dense, lad-tile, mac-decode)")
    ap.add_argument("--tiles", action=AtLeast, help="attention tiles of each engine (default: one per query head of "
                    "a layer, or per KV group for the LAD tile serving one)")
    ap.add_argument("--residency", default=",".join(RESIDENCY), help="resident, streamed or both")
    ap.add_argument("--node", type=int, help="technology node in nm (default: the constants' 45)")
    ap.add_argument("--clock", type=float, help="clock in MHz for every engine (default: each block's post-route "
                    "Fmax from its synthesis record)")
    ap.add_argument("--sram-budget", type=float, metavar="MIB", help="also report how many tiles fit this much SRAM")
    ap.add_argument("--activity", nargs="+", default=[], metavar="FILE",
                    help="activity records to use instead of the repository's (engine and context read from each)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--plot", help="write PNG plots into this folder")
    ap.add_argument("--lad-table3", action="store_true", help="print the LAD paper's Table III next to the model's tile")
    return ap


def build_engines(engines, shape, context, records: dict, clock):
    out = []
    for name in engines:
        if name == "dense":
            out.append(dense_engine(shape, context, clock))
            continue
        rec = records.get((name, context))
        if rec is None:
            rec = load_record(name, context)
            group = rec["config"]["group"] if name == "lad-tile" else 1
            if shape.kv_group % group:
                # the default tile serves a KV group the shape does not have: its one-head records
                rec = {**load_record(name, context, one_head=True),
                       "note": f"{shape.name}'s KV groups are not groups of {group}: the LAD tile serves one "
                               f"query head (one-head records)"}
        eng = (lad_engine if name == "lad-tile" else mac_engine)(shape, context, rec, clock)
        if "note" in rec:
            eng.notes.insert(0, rec["note"])
        out.append(eng)
    return out


def run(args) -> dict:
    shape = get_shape(args.model)
    tech = Tech(args.node)
    contexts = _list(args.contexts, "contexts", kind=int)
    drams = [tech.dram(d) for d in _list(args.dram, "dram", tech.drams)]
    engines = _list(args.engines, "engines", ENGINES)
    residencies = _list(args.residency, "residency", RESIDENCY)
    top = SHAPES["smollm2"].max_positions          # every activity record comes from a SmolLM2 run
    bad = [c for c in contexts if not 2 <= c <= top]
    if bad:
        raise ConfigError(f"context {bad[0]} is outside 2..{top} (the activity comes from SmolLM2 runs)")
    records = {}
    for path in args.activity:
        rec = read_activity(Path(path))
        records[(rec.get("engine"), rec["windows"][-1]["last_context"] + 1)] = rec
        records[(rec.get("engine"), rec["windows"][-1]["last_context"])] = rec
    rows, notes, tiles = [], [], {}
    for context in contexts:
        for eng in build_engines(engines, shape, context, records, args.clock):
            notes += [n for n in eng.notes if n not in notes]
            tiles[eng.name] = (args.tiles or default_tiles(eng, shape), eng.heads_per_tile)
            for dram in drams:
                for res in residencies:
                    r = decode_step(eng, shape, tech, dram, args.tiles, res).to_dict()
                    r.update(dram=dram.key, source=eng.source)
                    if args.sram_budget is not None:
                        r["tiles_in_budget"] = tiles_in_budget(eng, shape, res, args.sram_budget)
                    rows.append(r)
    if shape.max_positions and max(contexts) > shape.max_positions:
        notes.append(f"{shape.name} was trained to {shape.max_positions} positions; longer contexts are shape arithmetic only")
    return {"model": shape.name, "shape_source": shape.source, "node_nm": tech.node_nm, "tiles": tiles,
            "constants": "synth/system/constants.toml",
            "sram_budget_mib": args.sram_budget, "notes": notes, "rows": rows}


def tiles_text(tiles: dict) -> str:
    """'9 dense, 3 lad-tile (3 heads each), 9 mac-decode attention tiles'."""
    return ", ".join(f"{n} {name}" + (f" ({h} heads each)" if h > 1 else "")
                     for name, (n, h) in tiles.items()) + " attention tiles"


def print_result(res: dict) -> None:
    print(f"{res['model']}: decode step, {tiles_text(res['tiles'])}, {res['node_nm']} nm")
    for note in res["notes"]:
        print(f"  note: {note}")
    print("  ppl: the recorded SmolLM2 run's perplexity change against full attention (bit-accurate engine)")
    budget = res["sram_budget_mib"] is not None
    for dram in dict.fromkeys(r["dram"] for r in res["rows"]):
        print(f"\n{dram}")
        print(f"{'context':>7} {'engine':10} {'state':9} {'tok/s':>8} {'attn uJ/tok':>11} {'total uJ/tok':>12} "
              f"{'DRAM':>5} {'SRAM':>5} {'arith':>5} {'static':>6} {'SRAM MiB':>9} {'mm2':>7} {'ppl':>7}"
              + (" tiles-in-budget" if budget else ""))
        for r in (r for r in res["rows"] if r["dram"] == dram):
            e, tot = r["energy_j"], r["energy_per_token_j"]
            share = "".join(f" {100 * e[k] / tot:>{w - 1}.0f}%" for k, w in
                            (("dram", 5), ("sram", 5), ("arith", 5), ("static", 6)))
            ppl = "" if r["perplexity_delta_pct"] is None else f"{r['perplexity_delta_pct']:+.2f}%"
            print(f"{r['context']:>7} {r['engine']:10} {r['residency']:9} {r['tokens_per_s']:>8.1f} "
                  f"{1e6 * r['attention_energy_per_token_j']:>11.1f} {1e6 * tot:>12.1f}{share} "
                  f"{r['sram_mib']:>9.2f} {r['area_mm2']:>7.2f} {ppl:>7}"
                  + (f" {r['tiles_in_budget']:>15}" if budget else ""))


def plots(res: dict, folder) -> list[str]:
    """Energy per token by part for each engine (bars, per DRAM at each context) and tokens/s
    against context (lines)."""
    from golden.llm.plots import pyplot, save
    plt = pyplot()
    folder = Path(folder)
    out = []
    rows = res["rows"]
    for dram in dict.fromkeys(r["dram"] for r in rows):
        sel = [r for r in rows if r["dram"] == dram]
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{r['engine']}\n{r['residency'][:3]} {r['context'] // 1024}K" for r in sel]
        bottom = [0.0] * len(sel)
        for part, colour in (("dram", "#4c72b0"), ("sram", "#55a868"), ("arith", "#c44e52"), ("static", "#8172b2")):
            vals = [1e6 * r["energy_j"][part] for r in sel]
            ax.bar(range(len(sel)), vals, bottom=bottom, color=colour, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(sel)), labels, fontsize=6)
        ax.set_ylabel("energy per token (uJ)")
        ax.set_title(f"{res['model']} decode step on {dram}: energy by part")
        ax.legend(fontsize=7)
        out.append(str(save(fig, folder / f"system_energy_{dram}.png")))
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for eng, colour in zip(dict.fromkeys(r["engine"] for r in sel), ("#4c72b0", "#c44e52", "#55a868")):
            for res_kind, style in (("resident", "-"), ("streamed", "--")):
                pts = sorted((r["context"], r["tokens_per_s"]) for r in sel
                             if r["engine"] == eng and r["residency"] == res_kind)
                if pts:
                    ax.plot(*zip(*pts), style, color=colour, marker="o" if res_kind == "resident" else "x",
                            label=f"{eng} {res_kind}")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{res['model']} on {dram}", fontsize=9)
        ax.legend(fontsize=6)
        out.append(str(save(fig, folder / f"system_tokens_{dram}.png")))
    return out


def main(argv: list[str] | None = None) -> int:
    from golden.llm.report import save_outputs, write_json
    args = parser().parse_args(argv)
    if args.lad_table3:
        from .lad_paper import print_table3, table3
        t3 = table3(node_nm=args.node, clock_mhz=args.clock)
        print_table3(t3)
        if args.out:
            write_json(args.out, t3)
        return 0
    res = run(args)
    print_result(res)
    save_outputs(res, args, plots)
    return 0
