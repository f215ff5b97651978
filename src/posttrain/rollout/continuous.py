"""Multi-turn episodes without a turn barrier: each episode's next turn starts when its observation is
ready, inside one continuously batched decode (`posttrain.generation.continuous.ContinuousDecoder`).

    queue = every episode's prompt
    while episodes are running or queued:
        rows from the queue join the decode batch (up to batch_size rows)
        one decode step for every row
        the rows whose turn ended leave: their environment step runs now (one batched call for the
        rows that ended on the same step; for an environment that needs whole groups, such as the
        pairwise judge, once every running episode of the row's group has ended its turn); an
        episode that goes on joins the queue with its observation appended

Where the turn-by-turn loop waits for the batch's longest reply before any environment step, and
for every environment step before the next turn, here a short reply's episode is stepped and
decoding again while long replies are still being written. The sequences, masks, rewards and
bookkeeping are the same functions as the turn-by-turn loop's (`record_turn`, `apply_step`).

With vLLM (`engine_episode_loop`) the engine does the continuous batching: every episode's turn is
one request (`LLMEngine.add_request`), the loop runs the engine step by step, and an episode whose
request finished is stepped by its environment and submits its next turn at once, while the other
requests stay in the engine's running batch. Each turn keeps the token ids and logprobs vLLM sampled.

The loop runs where the model is: in each generation (or colocated policy) worker, on that worker's
share of the episodes (whole groups), calling the environment itself (`run_with_model`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from posttrain.environments.interface import EnvStepResult
from posttrain.generation.continuous import ContinuousDecoder
from posttrain.generation.sampling import SamplingParams, _eos_ids, sampling_seed
from posttrain.rollout.rollout import (
    EpisodeLimits,
    Trajectory,
    apply_step,
    episode_room,
    record_turn,
    turn_seed,
)


def episode_loop(
    model: torch.nn.Module,
    tokenizer: Any,
    trajectories: list[Trajectory],
    environment: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
    seed: int | None = None,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """Run `trajectories` (fresh episodes, prompts only) to their ends with continuous batching.

    Returns the trajectories (the same objects, in the same order) and the environment's step results."""
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    generator = torch.Generator().manual_seed(seed) if seed is not None and params.temperature > 0 else None
    decoder = ContinuousDecoder(
        model,
        eos_ids=eos_ids,
        pad_id=pad_id,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        tokenizer=tokenizer,
        generator=generator,
        room=params.max_new_tokens,
        keep_cache=True,
    )
    queue = list(range(len(trajectories)))
    kept: dict[int, list] = {}  # episode -> the KV cache of its finished turn, while it waits
    waiting: dict[int, tuple] = {}  # episode -> (its ended turn, its cache), until it is stepped
    whole_groups = needs_whole_groups(environment)
    results: list[EnvStepResult] = []
    was_training = model.training
    model.eval()
    try:
        while queue or len(decoder):
            joining, queue = (
                queue[: max(batch_size - len(decoder), 0)],
                queue[max(batch_size - len(decoder), 0) :],
            )
            _join(decoder, trajectories, joining, kept, params, limits)
            for row in decoder.step():
                waiting[row.key] = ((row.tokens, row.logprobs, row.finished_by == "length"), row.cache)
            ready = ready_to_step(list(waiting), trajectories, whole_groups)
            if ready:
                turns = [waiting[k][0] for k in ready]
                going_on = _step_ended(ready, turns, trajectories, environment, tokenizer, limits, results)
                kept.update({k: waiting[k][1] for k in going_on})
                for k in ready:
                    del waiting[k]
                queue += going_on
    finally:
        model.train(was_training)
    return trajectories, results


def needs_whole_groups(environment: Any) -> bool:
    """Whether `environment` scores the samples of a group together (`needs_whole_groups`: the
    pairwise judge; an `EnvironmentGroup` reports its environment's)."""
    return bool(getattr(environment, "needs_whole_groups", False))


def ready_to_step(waiting: list[int], trajectories: list[Trajectory], whole_groups: bool) -> list[int]:
    """The episodes among `waiting` (their turn ended) to step now, in `waiting`'s order: all of them;
    or, for an environment that needs whole groups, those whose group's running episodes have all
    ended their turn (a per-group turn barrier: the group is stepped in one call, never split)."""
    if not whole_groups:
        return waiting
    ended = set(waiting)
    open_groups = {t.group_id for k, t in enumerate(trajectories) if not t.done and k not in ended}
    return [k for k in waiting if trajectories[k].group_id not in open_groups]


def _join(
    decoder: ContinuousDecoder,
    trajectories: list[Trajectory],
    keys: list[int],
    kept: dict[int, list],
    params: SamplingParams,
    limits: EpisodeLimits,
) -> None:
    """Episodes `keys` join the decode: new ones prefill their prompt, continuing ones run only what
    came after their kept cache (their last sampled token and the observation)."""

    new = [k for k in keys if k not in kept]
    decoder.add(
        new,
        [trajectories[k].input_ids for k in new],
        [turn_budget(trajectories[k], params, limits) for k in new],
        [turn_stops(trajectories[k], params) for k in new],
    )
    going_on = [k for k in keys if k in kept]
    caches = [kept.pop(k) for k in going_on]
    decoder.resume(
        going_on,
        caches,
        [trajectories[k].input_ids[c[0][0].shape[1] :] for k, c in zip(going_on, caches, strict=True)],
        [turn_budget(trajectories[k], params, limits) for k in going_on],
        [turn_stops(trajectories[k], params) for k in going_on],
    )


def turn_budget(t: Trajectory, params: SamplingParams, limits: EpisodeLimits) -> int:
    """The most tokens t's next turn may generate: max_new_tokens, or what is left of max_seq_len or
    of the episode token budget."""
    room = episode_room(t, limits.max_episode_tokens)
    return min(params.max_new_tokens, limits.max_seq_len - len(t.input_ids), room)


def turn_stops(t: Trajectory, params: SamplingParams) -> tuple[str, ...]:
    """The stop strings of t's next turn: the configured ones and the episode's own."""
    return tuple(params.stop_strings) + t.stop_strings


def _step_ended(
    keys: list[int],
    turns: list[tuple[list[int], list[float], bool]],
    trajectories: list[Trajectory],
    environment: Any,
    tokenizer: Any,
    limits: EpisodeLimits,
    results: list,
) -> list[int]:
    """Record the ended turns ((token ids, logprobs, truncated) of episodes `keys`), step their episodes
    in one environment call; returns the episodes that go on."""
    episodes = [trajectories[k] for k in keys]
    turn_ids = [
        record_turn(t, ids, lps, truncated, tokenizer, limits.max_seq_len, None, limits.max_episode_tokens)
        for t, (ids, lps, truncated) in zip(episodes, turns, strict=True)
    ]
    result = environment.step([t.messages for t in episodes], [t.metadata for t in episodes])
    results.append(result)
    for j, t in enumerate(episodes):
        apply_step(t, result, j, turn_ids[j], tokenizer, limits)
    return [k for k, t in zip(keys, episodes, strict=True) if not t.done]


def engine_episode_loop(
    engine: Any,
    tokenizer: Any,
    trajectories: list[Trajectory],
    environment: Any,
    params: SamplingParams,
    limits: EpisodeLimits,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """Run `trajectories` (fresh episodes, prompts only) to their ends on a vLLM engine
    (`posttrain.generation.vllm_engine.VLLMGenerator`), one request per turn, with no turn barrier.

        submit every episode's first turn
        while requests are pending:
            one engine step (every running request decodes a token, queued ones prefill)
            the requests that finished: record their turns, step their episodes (one environment
            call), submit the next turn of each episode that goes on

    Turn n of episode k samples with seed `sampling_seed(turn_seed(params.seed, n), params.seed_stream,
    k)`: its own, whatever the order requests finish in. Returns the trajectories (the same objects, in
    the same order) and the environment's step results."""
    pending: dict[str, tuple[int, tuple[str, ...]]] = {}  # request id -> (episode, its stop strings)
    waiting: dict[int, tuple[list[int], list[float], bool]] = {}  # episode -> its ended turn
    whole_groups = needs_whole_groups(environment)
    results: list[EnvStepResult] = []

    def submit(k: int) -> None:
        t = trajectories[k]
        stops = turn_stops(t, params)
        turn = dataclasses.replace(params, max_new_tokens=turn_budget(t, params, limits), stop_strings=stops)
        seed = (
            None
            if params.seed is None
            else sampling_seed(turn_seed(params.seed, t.num_turns), params.seed_stream, k)
        )
        pending[engine.submit(t.input_ids, turn, seed)] = (k, stops)

    try:
        for k in range(len(trajectories)):
            submit(k)
        while pending:
            if not engine.has_unfinished():
                raise RuntimeError(f"the vLLM engine finished with {len(pending)} episode turns not reported")
            for request_id, out in engine.step():
                k, stops = pending.pop(request_id)
                waiting[k] = engine.completion(out, stops)
            ready = ready_to_step(list(waiting), trajectories, whole_groups)
            if ready:
                turns = [waiting.pop(k) for k in ready]
                for k in _step_ended(ready, turns, trajectories, environment, tokenizer, limits, results):
                    submit(k)
    finally:
        engine.abort(list(pending))  # an environment error leaves no request behind in the engine
    return trajectories, results


def run_episodes(
    sampler: Any,
    tokenizer: Any,
    trajectories: list[Trajectory],
    environment: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
    stream: int,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """One worker's episodes with no turn barrier: `sampler` is its HF model (`episode_loop`, one
    sampler seeded with `sampling_seed(params.seed, stream, 0)`) or its vLLM engine
    (`engine_episode_loop`, a seed per request, worker `stream`)."""
    if isinstance(sampler, torch.nn.Module):
        seed = None if params.seed is None else sampling_seed(params.seed, stream, 0)
        return episode_loop(sampler, tokenizer, trajectories, environment, params, batch_size, limits, seed)
    params = dataclasses.replace(params, seed_stream=stream)
    return engine_episode_loop(sampler, tokenizer, trajectories, environment, params, limits)


def split_by_group(trajectories: list[Trajectory], n: int) -> list[list[int]]:
    """Indices of the trajectories in at most n contiguous pieces of whole groups, sizes as even as
    groups allow (a group's samples stay on one worker, so its prompt is prefilled once)."""
    groups: list[list[int]] = []
    for i, t in enumerate(trajectories):
        if groups and trajectories[groups[-1][0]].group_id == t.group_id:
            groups[-1].append(i)
        else:
            groups.append([i])
    n = max(1, min(n, len(groups)))
    bounds = [round(k * len(groups) / n) for k in range(n + 1)]
    return [[i for g in groups[bounds[k] : bounds[k + 1]] for i in g] for k in range(n)]


def run_continuous(
    generator: Any,
    trajectories: list[Trajectory],
    environment: Any,
    tokenizer: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """`run_episodes` on every generation worker of `generator` (its `workers`, each with a share of
    whole groups and a seed stream of its own), or on the model or vLLM engine held in this process
    (`generator.model` / `generator.engine`)."""
    workers = getattr(generator, "workers", None)
    if workers is None:
        engine = getattr(generator, "engine", None)
        sampler = generator.model if engine is None else engine
        return run_episodes(sampler, tokenizer, trajectories, environment, params, batch_size, limits, 0)
    from posttrain.generation.worker import Sampling

    pieces = split_by_group(trajectories, len(workers))
    args = [
        (run_episodes, [trajectories[i] for i in piece], environment, params, batch_size, limits, k)
        for k, piece in enumerate(pieces)
    ]
    done: list[Trajectory] = []
    results: list[EnvStepResult] = []
    for part, part_results in workers.run(Sampling.run_with_model, args):
        done += part
        results += part_results
    return done, results
