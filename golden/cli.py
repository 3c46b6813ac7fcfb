"""The one command-line layer every ``ladmac`` command shares: an argparse parser whose errors
are one line (``ConfigError`` → exit 2 at the top level), the bounded integer option
(:class:`AtLeast`: counts, tokens, workers) and the one ``--set NAME=VALUE`` override parser that
edits any :class:`golden.config.BlockConfig`."""
from __future__ import annotations

import argparse
import sys

from .errors import ConfigError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises :class:`ConfigError` (one line, exit 2) instead of
    printing the usage block and exiting by itself."""

    def error(self, message):
        raise ConfigError(message)


class AtLeast(argparse.Action):
    """An integer option with a lower bound (``minimum``, default 1), checked as it is parsed:
    ``--vectors -5`` is the one line ``--vectors must be positive, got -5`` instead of a run that
    quietly does something else. Use: ``add_argument("--tokens", action=AtLeast, minimum=0, ...)``."""

    def __init__(self, option_strings, dest, minimum: int = 1, type=int, **kwargs):
        super().__init__(option_strings, dest, type=type, **kwargs)
        self.minimum = minimum

    def __call__(self, parser, namespace, value, option_string=None):
        if value < self.minimum:
            rule = "positive" if self.minimum == 1 else f">= {self.minimum}"
            parser.error(f"{option_string} must be {rule}, got {value}")
        setattr(namespace, self.dest, value)


def add_overrides(parser: argparse.ArgumentParser, what: str = "a config parameter") -> None:
    """The ``--set NAME=VALUE`` option (repeatable), read back with :func:`parse_overrides`."""
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help=f"override {what}")


def parse_overrides(pairs: list[str] | None) -> dict[str, str]:
    """``["a=1", "b = x"]`` → ``{"a": "1", "b": "x"}``; a pair without ``=`` is a ConfigError."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(f"--set expects NAME=VALUE, got '{pair}'")
        name, value = pair.split("=", 1)
        out[name.strip()] = value.strip()
    return out


def configure(base, pairs: list[str] | None):
    """``base`` (a config instance) with the ``--set`` pairs applied, validated; unknown names or
    bad values raise ConfigError naming the parameter."""
    return base.with_overrides(parse_overrides(pairs))


def configure_or_exit(prog: str, base, pairs: list[str] | None):
    """:func:`configure` for a script's ``main``: a bad override prints ``prog: error: ...`` (one
    line) and exits 2, before any slow start-up."""
    try:
        return configure(base, pairs)
    except ConfigError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
