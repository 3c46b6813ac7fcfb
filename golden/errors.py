"""Errors raised for bad user input. The CLI turns each into one line and exit code 2."""


class LadmacError(Exception):
    """Base class: a problem the user can fix (bad config, missing file, malformed data)."""


class ConfigError(LadmacError, ValueError):
    """A block config that cannot be built (message names the parameter and the rule)."""


class DataError(LadmacError):
    """A missing, corrupt or malformed input file, model package or store."""
