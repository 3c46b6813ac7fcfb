"""ladmac command line: list blocks, emit Verilog, run cocotb checks, the demo, and the
golden-model evaluations. Bad input exits with code 2 and one line saying what is wrong."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _config(args):
    from golden.cli import parse_overrides
    from hdl.registry import make_config
    return make_config(args.block, parse_overrides(args.set), args.preset)


def cmd_blocks(args) -> int:
    from hdl.registry import BLOCKS, make_config
    for block in BLOCKS.values():
        print(f"{block.name}: {block.summary}")
        defaults = make_config(block.name)   # the block's own (a one-head module's at group 1)
        for name, _, help_text in block.config_class.describe():
            print(f"    {name:<18} = {getattr(defaults, name)!s:<8} {help_text}")
        print(f"    presets: {', '.join(block.presets)}")
    return 0


def cmd_verilog(args) -> int:
    from hdl.generate import generate_verilog
    cfg = _config(args)
    lint = args.lint and args.output not in (None, "-")
    text = generate_verilog(args.block, cfg, lint=lint)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out} ({args.block}, {len(text.splitlines())} lines{', lint clean' if lint else ''})",
              file=sys.stderr)
    return 0


def cmd_sim(args) -> int:
    from testbenches.runner import simulate
    cfg = _config(args)
    t0 = time.time()
    report = simulate(args.block, cfg, seed=args.seed, name="cli", waves=args.waves,
                      params={"vectors": args.vectors, "steps": args.vectors})
    print(f"{args.block}: {report['vectors']} vectors, {report['mismatches']} mismatches vs the golden "
          f"model under Verilator (seed {args.seed}, {time.time() - t0:.1f} s); log {report['log']}")
    if args.waves:
        print(f"waveform: {report['waves']}")
    return 0 if report["mismatches"] == 0 else 1


def cmd_demo(args) -> int:
    from golden.paths import BUILD_ROOT
    from hdl.generate import generate_verilog
    from hdl.registry import BLOCKS
    from testbenches.runner import simulate
    out_dir = BUILD_ROOT / "verilog"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"1. Verilog for every block at its default config -> {out_dir}/")
    for name, block in BLOCKS.items():
        cfg = block.config_class()
        path = out_dir / f"{name}.v"
        path.write_text(generate_verilog(name, cfg, lint=True))
        print(f"   {name:<10} {len(path.read_text().splitlines()):>6} lines  lint clean  {path}")
    block = "vpu"
    cfg = BLOCKS[block].config_class()
    print(f"2. cocotb + Verilator check of '{block}' against the golden model (200 random vectors + corners,"
          " random gaps and back-pressure)")
    t0 = time.time()
    report = simulate(block, cfg, seed=1, name="demo", params={"vectors": 200})
    print(f"   {report['vectors']} vectors, {report['mismatches']} mismatches, {report['cycles']} cycles "
          f"simulated in {time.time() - t0:.1f} s; log {report['log']}")
    print("Done. `ladmac blocks` lists the parameters; `ladmac verilog BLOCK --set NAME=VALUE -o FILE` "
          "emits other configs; `make test` runs every check.")
    return 0


def cmd_eval(args, rest: list[str]) -> int:
    if args.method == "attncache":
        from golden.llm.attncache_eval import main
        return main(rest)
    from golden.llm.decode_eval import main
    return main(args.method, rest)


def cmd_sweep(rest: list[str]) -> int:
    from benchmarks.sweep import main
    return main(rest)


def cmd_synth(rest: list[str]) -> int:
    from synth.cli import main
    return main(rest)


def cmd_system(rest: list[str]) -> int:
    from synth.system.cli import main
    return main(rest)


def cmd_formal(rest: list[str]) -> int:
    from testbenches.formal.cli import main
    return main(rest)


def build_parser() -> argparse.ArgumentParser:
    from golden.cli import AtLeast, Parser, add_overrides
    from hdl.registry import BLOCKS
    parser = Parser(prog="ladmac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("blocks", help="list every block with its parameters and defaults")

    def block_args(p):
        p.add_argument("block", help=f"one of: {', '.join(BLOCKS)}")
        add_overrides(p)
        p.add_argument("--preset", help="start from a named preset instead of the defaults")

    p = sub.add_parser("verilog", help="emit Verilog for a block")
    block_args(p)
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--no-lint", dest="lint", action="store_false", help="skip verilator --lint-only")
    p = sub.add_parser("sim", help="check a block under Verilator against the golden model")
    block_args(p)
    p.add_argument("--vectors", action=AtLeast, default=1000, help="random vectors (steps) to check (1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--waves", action="store_true", help="record an FST waveform (Verilator --trace-fst)")
    sub.add_parser("demo", help="the main job on built-in defaults: Verilog for every block + one cocotb check")
    p = sub.add_parser("eval", help="run LAD / MAC / AttnCache inside real LLMs (see `ladmac eval METHOD -h`)",
                       add_help=False)
    p.add_argument("method", choices=["lad", "mac", "attncache"])
    sub.add_parser("synth", help="synthesise a block for ECP5 / generic cells (see `ladmac synth -h`)",
                   add_help=False)
    sub.add_parser("formal", help="formal stream properties of blocks (SymbiYosys; see `ladmac formal -h`)",
                   add_help=False)
    sub.add_parser("system", help="tokens/s, energy and area of a whole model's decode step per engine "
                   "(see `ladmac system -h`)", add_help=False)
    sub.add_parser("sweep", help="design sweep of LAD inside SmolLM2 through Ray (see `ladmac sweep lad -h`)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from golden.errors import LadmacError
    try:
        parser = build_parser()
        if argv[:1] == ["eval"]:
            args, rest = parser.parse_known_args(argv)
            return cmd_eval(args, rest)
        if argv[:1] == ["synth"]:
            return cmd_synth(argv[1:])
        if argv[:1] == ["formal"]:
            return cmd_formal(argv[1:])
        if argv[:1] == ["sweep"]:
            return cmd_sweep(argv[1:])
        if argv[:1] == ["system"]:
            return cmd_system(argv[1:])
        args = parser.parse_args(argv)
        if getattr(args, "block", None) is not None:
            from hdl.registry import get_block
            get_block(args.block)
        return {"blocks": cmd_blocks, "verilog": cmd_verilog, "sim": cmd_sim, "demo": cmd_demo}[args.command](args)
    except LadmacError as err:
        print(f"ladmac: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # unwritable output, missing file given on the command line
        print(f"ladmac: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
