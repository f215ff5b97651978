"""Environments score rollouts: the `Environment` protocol, math (math-verify), reward-function adapter,
reward model, reasoning-gym tasks, the sliding puzzle game, tools (calculator, python), code (sandboxed tests),
LLM-as-judge, any OpenEnv server by URL (`openenv`), any `verifiers` taskset (`verifiers`), and any of them behind a step latency
(`latency`, for benchmarks).

`EnvironmentGroup` runs any of them as Ray actors or in-process.
See docs/environments.md for writing your own.
"""

from posttrain.data.boxed import extract_last_boxed
from posttrain.environments.calculator import CalculatorEnvironment
from posttrain.environments.code import CodeEnvironment
from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.interface import (
    ENVIRONMENTS,
    Environment,
    EnvStepResult,
    EpisodeStart,
    Message,
    RewardFunctionEnvironment,
    last_assistant_content,
    make_environment,
    observation_messages,
    register_environment,
    resolve_environment,
    task_start,
)
from posttrain.environments.judge import JudgeEnvironment
from posttrain.environments.latency import LatencyEnvironment
from posttrain.environments.math import MathEnvironment, math_verify_equal
from posttrain.environments.math_format import MathFormatEnvironment
from posttrain.environments.openenv_env import OpenEnvEnvironment
from posttrain.environments.python_tool import PythonToolEnvironment
from posttrain.environments.reasoning_gym_env import ReasoningGymEnvironment
from posttrain.environments.reward_funcs import RewardFuncsEnvironment
from posttrain.environments.reward_model import RewardModelEnvironment
from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
from posttrain.environments.text2sql import Text2SQLEnvironment
from posttrain.environments.timeout_pool import CallOutcome, TimeoutPool
from posttrain.environments.tools import ToolEnvironment, ToolRegistry
from posttrain.environments.verifiers_env import VerifiersEnvironment
from posttrain.environments.wordle import WordleEnvironment

__all__ = [
    "CalculatorEnvironment",
    "CodeEnvironment",
    "ENVIRONMENTS",
    "CallOutcome",
    "EnvStepResult",
    "EnvironmentGroup",
    "Environment",
    "EpisodeStart",
    "JudgeEnvironment",
    "LatencyEnvironment",
    "MathEnvironment",
    "MathFormatEnvironment",
    "OpenEnvEnvironment",
    "Message",
    "PythonToolEnvironment",
    "ReasoningGymEnvironment",
    "RewardFunctionEnvironment",
    "RewardFuncsEnvironment",
    "RewardModelEnvironment",
    "SlidingPuzzleEnvironment",
    "Text2SQLEnvironment",
    "TimeoutPool",
    "VerifiersEnvironment",
    "ToolEnvironment",
    "ToolRegistry",
    "WordleEnvironment",
    "extract_last_boxed",
    "last_assistant_content",
    "make_environment",
    "math_verify_equal",
    "observation_messages",
    "register_environment",
    "resolve_environment",
    "task_start",
]
