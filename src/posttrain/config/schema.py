"""The config classes under their old single-module name: `posttrain.config.schema` re-exports every
section and command config from the module it lives in (common, rollout, loss, rl, ppo, supervised,
eval) and `ALGORITHM_CONFIGS` (`posttrain.config.commands`). New code imports from those modules."""

# ruff: noqa: F401, F403
from __future__ import annotations

from posttrain.config.commands import ALGORITHM_CONFIGS
from posttrain.config.common import *
from posttrain.config.eval import *
from posttrain.config.loss import *
from posttrain.config.ppo import *
from posttrain.config.rl import *
from posttrain.config.rollout import *
from posttrain.config.supervised import *
