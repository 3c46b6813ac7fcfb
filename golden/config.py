"""Base of every block config: a frozen, self-validating dataclass.

The same config object sizes the RTL, drives the bit-accurate model, names the
Verilator build (``key()``) and is what ``ladmac ... --set NAME=VALUE`` edits.
Each field carries a one-line ``help`` in its metadata; ``describe()`` lists them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from .errors import ConfigError


def param(default, help: str):
    """A config field with a default and a one-line description."""
    return dataclasses.field(default=default, metadata={"help": help})


class BlockConfig:
    """Mixin for frozen dataclass configs. Subclasses implement ``validate()``."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            want = type(f.default)
            if want is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{type(self).__name__}.{f.name} must be an integer, got {value!r}")
            if want is float and not isinstance(value, (int, float)):
                raise ConfigError(f"{type(self).__name__}.{f.name} must be a number, got {value!r}")
            if want is bool and not isinstance(value, bool):
                raise ConfigError(f"{type(self).__name__}.{f.name} must be true or false, got {value!r}")
        self.validate()

    def validate(self) -> None:  # pragma: no cover - overridden
        pass

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            raise ConfigError(f"{type(self).__name__}: {message}")

    # -- introspection -----------------------------------------------------------
    @classmethod
    def describe(cls) -> list[tuple[str, Any, str]]:
        return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        return cls(**json.loads(text))

    def key(self) -> str:
        """Short stable name of this config, used for build caches."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:10]

    @classmethod
    def from_overrides(cls, overrides: dict[str, str]):
        """Build from ``NAME=VALUE`` strings (CLI ``--set``), parsing each by the field's type."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, text in overrides.items():
            if name not in fields:
                raise ConfigError(
                    f"unknown parameter '{name}' for {cls.__name__} (known: {', '.join(fields)})")
            kind = type(fields[name].default)
            try:
                if kind is bool:
                    low = text.strip().lower()
                    if low not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError
                    kwargs[name] = low in ("1", "true", "yes")
                elif kind is int:
                    kwargs[name] = int(text, 0)
                elif kind is float:
                    kwargs[name] = float(text)
                else:
                    kwargs[name] = text
            except ValueError:
                raise ConfigError(f"parameter '{name}' expects {kind.__name__}, got '{text}'") from None
        return cls(**kwargs)

    def with_overrides(self, overrides: dict[str, str]):
        """This config with ``NAME=VALUE`` strings applied (parsed by field type, validated);
        itself when there are none."""
        if not overrides:
            return self
        values = {k: str(v) for k, v in self.to_dict().items()}
        values.update(overrides)
        return type(self).from_overrides(values)
