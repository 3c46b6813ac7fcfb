"""``ladmac formal [BLOCK ...]`` (and ``make formal``): run the formal tasks of blocks and print
one line per task (status, depth or k, seconds, counterexample or unreached covers).

Each block runs the modes of its spec (testbenches/formal/specs.py): ``prove`` (k-induction of
the stream protocol; where it does not close the protocol is checked by BMC in ``bmc``),
``bmc`` (protocol, counting and gate rules), ``deep`` (counting and gate rules deeper, on the
model with datapath cells cut), ``prefix`` (what ``bmc`` checks, after a simulated prefix, for
blocks whose outputs lie deeper than the solver reaches from reset), ``live`` (bounded
liveness) and ``cover``. A task
that runs out of its ``--timeout`` prints TIMEOUT. Exit status: 0 when every task passed,
1 otherwise, 2 on a bad argument (one line)."""
from __future__ import annotations

import time

from golden.cli import AtLeast, Parser, add_overrides, parse_overrides
from golden.errors import ConfigError

MODES = ("prove", "bmc", "deep", "prefix", "live", "cover")


def build_parser() -> Parser:
    from .specs import SPECS
    p = Parser(prog="ladmac formal", description=__doc__.split("\n\n")[0])
    p.add_argument("blocks", nargs="*", metavar="BLOCK", help=f"blocks to check (default: all: {', '.join(SPECS)})")
    p.add_argument("--big", action="store_true", help="the larger config of each spec (default: the small one)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--depth", action=AtLeast, help="override the depth (k for prove) of every task")
    p.add_argument("--timeout", action=AtLeast, default=600, help="seconds per task (default 600)")
    add_overrides(p, "a config parameter of the (single) block's formal config")
    return p


def main(argv: list[str] | None = None) -> int:
    from .sby import run
    from .specs import SPECS
    args = build_parser().parse_args(argv)
    blocks = args.blocks or list(SPECS)
    for b in blocks:
        if b not in SPECS:
            raise ConfigError(f"unknown block '{b}' (known: {', '.join(SPECS)})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"unknown mode '{mode}' (known: {', '.join(MODES)})")
    overrides = parse_overrides(args.set)
    if overrides and len(blocks) != 1:
        raise ConfigError("--set needs exactly one BLOCK")
    failed, t0, count = 0, time.time(), 0
    for block in blocks:
        spec = SPECS[block]
        cfg = (spec.big if args.big else spec.small).with_overrides(overrides)
        for mode in modes:
            if (mode == "deep" and not spec.abstract) or (mode == "prefix" and not spec.prefix):
                continue   # no cut model: bmc checks everything; no prefix: bmc starts from reset
            if getattr(spec.depths(cfg), mode) is None and args.depth is None:
                print(f"{block:<10} {mode:<6} not attempted: {spec.note or 'see docs/verification.md'}")
                continue
            result = run(block, cfg, mode, args.depth, timeout=args.timeout)
            print(result.line(), flush=True)
            count += 1
            bad = result.status != "PASS" or result.failed or (mode == "cover" and result.unreached)
            failed += bool(bad)
    print(f"formal: {count - failed} passed, {failed} failed ({time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    import sys
    try:
        sys.exit(main())
    except ConfigError as err:
        print(f"ladmac formal: error: {err}", file=sys.stderr)
        sys.exit(2)
