"""What an algorithm's config section is built from: the error type and the field helper.

Both `pal_hpc.config` (the run-wide fields, which reads the algorithm registry) and every
algorithm module import from here, so neither imports the other at both ends: the
algorithms depend on this module only, and config depends on the algorithms.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the message starts with the field name."""


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field carrying its `--help` text (and optional `choices`): a flag."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})
