"""posttrain: post-training for language models (SFT, DPO, reward models, GRPO) on a laptop CPU or a Ray cluster.

The Python API (docs/python_api.md): `posttrain.sft`, `dpo`, `rm`, `grpo`, `ppo`, `distill` and
`evaluate` run the CLI's commands from Python; the config classes (`posttrain.GRPOConfig`, ...)
and `load_config` build their configs. Everything else is imported on first use, so `import posttrain`
loads `posttrain.config` (pydantic) but neither torch nor transformers nor ray.

This root also installs what config validation looks up in the floors above config (environment
names and kwargs, tool-call parsers; `posttrain.config.rollout.Lookups`), imported when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from posttrain.config.rollout import Lookups, install_lookups

__version__ = "0.1.0"


def _check_environment(name: str, kwargs: dict[str, Any]) -> None:
    import posttrain.environments  # noqa: F401  (registers the built-in environments)
    from posttrain.environments.interface import check_environment

    check_environment(name, kwargs)


def _turn_limit(name: str, kwargs: dict[str, Any]) -> tuple[str, int] | None:
    import posttrain.environments  # noqa: F401  (registers the built-in environments)
    from posttrain.environments.interface import ENVIRONMENTS, episode_turn_limit

    cls = ENVIRONMENTS.get(name)
    return None if cls is None else episode_turn_limit(cls, kwargs)


def _tool_parsers() -> list[str]:
    from posttrain.endpoint.parsers import TOOL_CALL_PARSERS

    return list(TOOL_CALL_PARSERS)


install_lookups(Lookups(_check_environment, _turn_limit, _tool_parsers))

_EXPORTS = {
    **{
        name: "posttrain.api"
        for name in ("sft", "dpo", "rm", "grpo", "ppo", "distill", "evaluate", "make_config")
    },
    **{name: "posttrain.config.supervised" for name in ("SFTConfig", "DPOConfig", "RMConfig")},
    **{name: "posttrain.config.rl" for name in ("GRPOConfig", "DistillConfig")},
    "PPOConfig": "posttrain.config.ppo",
    "EvalConfig": "posttrain.config.eval",
    "load_config": "posttrain.config.loader",
    "ConfigError": "posttrain.config.loader",
    "DataError": "posttrain.data.sources",
    "UserError": "posttrain.errors",
    "Environment": "posttrain.environments.interface",
    "EnvStepResult": "posttrain.environments.interface",
    "register_environment": "posttrain.environments.interface",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
