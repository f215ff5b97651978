"""The advantage registry: every estimator one named function ``(inputs, knobs) -> Tensor``.

Modelled on verl's ``core_algos.register_adv_est``: a decorator adds a function to
``ADVANTAGE_ESTIMATORS`` under its config name, and a trainer makes ONE call,

    advantages = estimate_advantages(cfg.advantage, AdvantageInputs(rewards, group_ids, ...))

which looks the estimator up by ``knobs.estimator``, runs it and finishes the result
(``finish_advantages``: whitening where the knobs ask for it, then the clip).

``inputs`` (``AdvantageInputs``) holds every tensor some estimator reads; each estimator reads
only its own fields and raises a ValueError naming what it misses. ``knobs`` is the algorithm's
advantage config, duck-typed: this floor never imports ``posttrain.config`` (import-linter
contract "algorithms: pure math"), so each estimator states the attributes it reads as a
``Protocol`` (``GroupKnobs``, ``ReinforcePPKnobs``, ...) that the pydantic config satisfies.

Estimators of group rewards see only the ``trainable_samples`` when ``inputs.scored`` is given
(``on_trainable_rows``): every baseline, std and batch normalisation is over scored samples of
groups with two or more of them, every other sample gets exactly 0. With ``inputs.kl`` the group
estimators use the KL-penalised rewards r_i - β Σ_t KL_it (``kl_penalized_rewards``); reinforce_pp
takes the KL per token instead (``reinforce_pp_advantages``); gdpo ignores it.

To add an estimator: write ``@register_advantage_estimator("name")`` over a function of
``(inputs: AdvantageInputs, knobs: YourKnobs) -> torch.Tensor`` ([N] or [N, T]) and add "name" to
the config's ``estimator`` Literal (docs/algorithms.md, "The advantage registry").
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from posttrain.algorithms.advantages import (
    clip_advantages,
    dr_grpo_advantages,
    gdpo_advantages,
    grpo_advantages,
    kl_penalized_rewards,
    raw_reward_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    trainable_samples,
)
from posttrain.algorithms.distillation import on_policy_distill_advantages
from posttrain.algorithms.gae import gae_advantages, length_adaptive_lambda, whiten


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read, for N samples of T token positions.

    rewards: [N] scalar reward per sample (scaled and shaped by the trainer).
    group_ids: [N] integer id of each sample's group (prompt); any values, any order.
    mask: [N, T] 1 on generated (trained) tokens.
    scored: [N] bool, the environment could score the sample (None: all were).
    kl: [N, T] per-token KL(π || π_ref) estimates, no gradient; with kl_beta the KL as a reward.
    teacher_logprobs, student_logprobs: [N, T] log-probabilities of the sampled tokens (on_policy_distill).
    token_rewards, values: [N, T] per-token rewards and the critic's V(s_t) (gae).
    components: [N, K] named parts of each sample's reward, ``component_names`` their K names (gdpo).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    mask: torch.Tensor | None = None
    scored: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    kl_beta: float = 0.0
    teacher_logprobs: torch.Tensor | None = None
    student_logprobs: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    components: torch.Tensor | None = None
    component_names: tuple[str, ...] = ()

    def rows(self, keep: torch.Tensor) -> AdvantageInputs:
        """The same inputs on the rows where ``keep`` ([N] bool) is True; ``scored`` dropped."""
        n = self.rewards.shape[0]
        taken: dict[str, Any] = {"scored": None}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "scored" and isinstance(value, torch.Tensor) and value.dim() and len(value) == n:
                taken[f.name] = value[keep]
        return dataclasses.replace(self, **taken)


class EstimatorKnobs(Protocol):
    """What ``estimate_advantages`` reads of every advantage config. Optional attributes, absent
    meaning off: ``whiten`` (bool), ``clip_low`` / ``clip_high`` (float | None)."""

    estimator: str
    clip: float | None


class GroupKnobs(Protocol):
    """grpo's knobs (``grpo_advantages``); gdpo and on_policy_distill read them too."""

    normalize_std: bool
    leave_one_out: bool
    leave_one_out_std: bool


class ReinforcePPKnobs(Protocol):
    """reinforce_pp: subtract each group's mean before the batch normalisation."""

    minus_baseline: bool


class GDPOKnobs(GroupKnobs, Protocol):
    """gdpo: the weight of each named reward component (None: all 1)."""

    reward_weights: dict[str, float] | None


class DistillKnobs(GroupKnobs, Protocol):
    """on_policy_distill: the teacher term's coefficient and the weight of the grpo reward advantage."""

    distill_coef: float
    distill_reward_weight: float


class GAEKnobs(Protocol):
    """gae: discount γ and the policy's λ (or VAPO's length-adaptive λ with α)."""

    gamma: float
    lam_actor: float
    lam_actor_alpha: float | None


AdvantageEstimator = Callable[[AdvantageInputs, Any], torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""name -> estimator, filled by ``register_advantage_estimator``; the names of the configs' Literals."""


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: add the function to ``ADVANTAGE_ESTIMATORS`` as ``name`` (ValueError if taken)."""

    def add(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered already")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return add


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator ``name``; ValueError listing the names (and the closest) if unknown."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(ADVANTAGE_ESTIMATORS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}.{hint}"
        ) from None


def finish_advantages(advantages: torch.Tensor, inputs: AdvantageInputs, knobs: Any) -> torch.Tensor:
    """``whiten`` over ``inputs.mask`` if ``knobs.whiten``, then ``clip_advantages`` with ``knobs.clip``
    (or ``knobs.clip_low`` / ``clip_high``). A trainer that logs statistics of the raw advantages
    (PPO) calls ``advantage_estimator(name)`` and this apart; ``estimate_advantages`` is the two."""
    if getattr(knobs, "whiten", False):
        advantages = whiten(advantages, _needs(inputs.mask, "mask", knobs.estimator))
    low, high = getattr(knobs, "clip_low", None), getattr(knobs, "clip_high", None)
    return clip_advantages(advantages, knobs.clip, low=low, high=high)


def estimate_advantages(knobs: EstimatorKnobs, inputs: AdvantageInputs) -> torch.Tensor:
    """The advantages of the configured estimator: ``ADVANTAGE_ESTIMATORS[knobs.estimator](inputs,
    knobs)``, finished (``finish_advantages``). [N], or [N, T] for the per-token estimators."""
    raw = advantage_estimator(knobs.estimator)(inputs, knobs)
    return finish_advantages(raw, inputs, knobs)


def on_trainable_rows(
    inputs: AdvantageInputs, fn: Callable[[AdvantageInputs], torch.Tensor], *, per_token: bool = False
) -> torch.Tensor:
    """``fn(inputs)`` on the ``trainable_samples`` only (scored, in a group with >= 2 scored), exactly 0
    for the other rows ([N], or [N, T] with ``per_token``, in the rewards' float dtype). Without
    ``inputs.scored``, or with every sample trainable, ``fn(inputs)`` as it is."""
    if inputs.scored is None:
        return fn(inputs)
    keep = trainable_samples(inputs.group_ids, inputs.scored)
    if bool(keep.all()):
        return fn(inputs)
    rewards = inputs.rewards if inputs.rewards.is_floating_point() else inputs.rewards.float()
    n = rewards.shape[0]
    shape = (n, _needs(inputs.mask, "mask", "per-token").shape[1]) if per_token else (n,)
    out = torch.zeros(shape, dtype=rewards.dtype)
    if bool(keep.any()):
        out[keep] = fn(inputs.rows(keep)).to(out.dtype)
    return out


def _needs(value: torch.Tensor | None, what: str, estimator: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{what}")
    return value


def _group(knobs: GroupKnobs) -> dict[str, bool]:
    """grpo_advantages' keyword arguments from the group knobs."""
    names = ("normalize_std", "leave_one_out", "leave_one_out_std")
    return {name: getattr(knobs, name) for name in names}


def _rewards(x: AdvantageInputs) -> torch.Tensor:
    """The rewards, minus β Σ_t KL_t when ``x.kl`` is given (``kl_penalized_rewards``)."""
    if x.kl is None:
        return x.rewards
    return kl_penalized_rewards(x.rewards, x.kl, _needs(x.mask, "mask", "kl"), kl_beta=x.kl_beta)


@register_advantage_estimator("grpo")
def grpo_estimator(inputs: AdvantageInputs, knobs: GroupKnobs) -> torch.Tensor:
    """``grpo_advantages`` of the (KL-penalised) rewards with the group knobs; [N]."""
    return on_trainable_rows(inputs, lambda x: grpo_advantages(_rewards(x), x.group_ids, **_group(knobs)))


@register_advantage_estimator("dr_grpo")
def dr_grpo_estimator(inputs: AdvantageInputs, knobs: Any) -> torch.Tensor:
    """``dr_grpo_advantages`` (r - group mean) of the (KL-penalised) rewards; [N]. No knobs."""
    return on_trainable_rows(inputs, lambda x: dr_grpo_advantages(_rewards(x), x.group_ids))


@register_advantage_estimator("rloo")
def rloo_estimator(inputs: AdvantageInputs, knobs: Any) -> torch.Tensor:
    """``rloo_advantages`` (r - mean of the others) of the (KL-penalised) rewards; [N]. No knobs."""
    return on_trainable_rows(inputs, lambda x: rloo_advantages(_rewards(x), x.group_ids))


@register_advantage_estimator("reinforce_pp")
def reinforce_pp_estimator(inputs: AdvantageInputs, knobs: ReinforcePPKnobs) -> torch.Tensor:
    """``reinforce_pp_advantages``: batch-normalised, [N]; with ``inputs.kl`` the KL is a per-token
    reward (return-to-go), normalised over the valid tokens, [N, T]."""
    baseline = knobs.minus_baseline
    return on_trainable_rows(
        inputs,
        lambda x: reinforce_pp_advantages(
            x.rewards, x.group_ids, group_baseline=baseline, kl=x.kl, mask=x.mask, kl_beta=x.kl_beta
        ),
        per_token=inputs.kl is not None,
    )


@register_advantage_estimator("gdpo")
def gdpo_estimator(inputs: AdvantageInputs, knobs: GDPOKnobs) -> torch.Tensor:
    """``gdpo_advantages`` of the named reward components, weighted by name (``gdpo_weights``); [N].
    ``inputs.rewards`` and ``inputs.kl`` are not used."""
    if inputs.components is None:
        raise ValueError("advantage.estimator=gdpo needs the episodes' reward components")
    weights = gdpo_weights(list(inputs.component_names), knobs.reward_weights)
    return on_trainable_rows(
        inputs,
        lambda x: gdpo_advantages(
            x.rewards, x.group_ids, components=x.components, weights=weights, **_group(knobs)
        ),
    )


@register_advantage_estimator("on_policy_distill")
def on_policy_distill_estimator(inputs: AdvantageInputs, knobs: DistillKnobs) -> torch.Tensor:
    """``on_policy_distill_advantages``: distill_coef (log π_T - log π_S) per generated token, plus
    distill_reward_weight times the grpo advantage of the (KL-penalised) rewards (when > 0); [N, T].
    The teacher's term needs no group: every row keeps it, scored or not."""
    if inputs.teacher_logprobs is None or inputs.student_logprobs is None or inputs.mask is None:
        raise ValueError("on_policy_distill needs teacher_logprobs, student_logprobs and mask")
    env = None
    if knobs.distill_reward_weight > 0:
        env = knobs.distill_reward_weight * grpo_estimator(inputs, knobs)
    return on_policy_distill_advantages(
        inputs.teacher_logprobs, inputs.student_logprobs, inputs.mask, advantages=env,
        coefficient=knobs.distill_coef,
    )  # fmt: skip


@register_advantage_estimator("gae")
def gae_estimator(inputs: AdvantageInputs, knobs: GAEKnobs) -> torch.Tensor:
    """The policy's GAE advantages (``gae_advantages``) of ``token_rewards`` and ``values`` with γ and
    λ_actor, or VAPO's length-adaptive λ (``length_adaptive_lambda``) with lam_actor_alpha; [N, T]
    float64. The critic's targets (λ_critic) are not advantages: the trainer computes them apart."""
    mask = _needs(inputs.mask, "mask", "gae")
    values = _needs(inputs.values, "values", "gae").double()
    token_rewards = _needs(inputs.token_rewards, "token_rewards", "gae")
    lam = knobs.lam_actor
    if knobs.lam_actor_alpha is not None:
        lam = length_adaptive_lambda(mask.sum(-1), alpha=knobs.lam_actor_alpha)
    return gae_advantages(token_rewards, values, mask, gamma=knobs.gamma, lam=lam).advantages


@register_advantage_estimator("raw_reward")
def raw_reward_estimator(inputs: AdvantageInputs, knobs: Any) -> torch.Tensor:
    """NeMo RL's raw_reward: A = the sample's reward on every generated token (``raw_reward_advantages``),
    no baseline; [N, T] float64. No knobs."""
    return raw_reward_advantages(inputs.rewards.double(), _needs(inputs.mask, "mask", "raw_reward"))


def gdpo_weights(names: list[str], weights: dict[str, float] | None) -> list[float]:
    """The weight of each named reward component, in `names`' order (None: all 1). ValueError
    unless `weights` names exactly the components the environment returned, and at least two."""
    if len(names) < 2:
        raise ValueError(
            f"advantage.estimator=gdpo needs an environment that returns at least two named reward "
            f"components (EnvStepResult.reward_components); this batch has {names or 'none'}. "
            "Use estimator=grpo for one reward"
        )
    if weights is None:
        return [1.0] * len(names)
    if set(weights) != set(names):
        raise ValueError(
            f"advantage.reward_weights names {sorted(weights)}, the environment's reward components are "
            f"{names}: give one weight per component"
        )
    return [float(weights[name]) for name in names]
