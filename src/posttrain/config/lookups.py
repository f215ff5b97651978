"""What config validation looks up in the floors above config: whether an environment name and its
kwargs resolve, the turn limit they set, and which tool-call parsers are registered.

`posttrain.config` may not import `posttrain.environments` or `posttrain.endpoint` (they sit above it,
docs/architecture.md), so the package root (`posttrain/__init__.py`) installs these lookups
(`install_lookups`) before any config module loads; they import those floors on first use. Until
installed nothing is looked up and those checks pass (it never happens in practice: importing any
`posttrain.<module>` runs the package root first).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lookups:
    """The functions config validators call into the floors above config."""

    check_environment: Callable[[str, dict[str, Any]], None]
    """Raise ValueError (EnvironmentSpecError) unless `environment.name` resolves to an environment
    class whose constructor takes `environment.kwargs` (`environments.interface.check_environment`)."""
    turn_limit: Callable[[str, dict[str, Any]], tuple[str, int] | None]
    """(kwarg, value) bounding an episode's turns for a registered environment name; None for an
    environment without one or a name that is not registered (an import path is not imported)."""
    tool_parsers: Callable[[], Collection[str]]
    """The names of the registered tool-call parsers (`endpoint.parsers.TOOL_CALL_PARSERS`)."""


_INSTALLED: list[Lookups] = []


def install_lookups(lookups: Lookups) -> None:
    """Make `lookups` the ones config validation uses (the package root calls this once)."""
    _INSTALLED[:] = [lookups]


def installed_lookups() -> Lookups | None:
    """The installed lookups, or None before `install_lookups`."""
    return _INSTALLED[0] if _INSTALLED else None
