"""Multi-turn episodes without a turn barrier: each episode's next turn starts when its observation is
ready, inside one continuously batched decode (`posttrain.generation.continuous.ContinuousDecoder`).

    queue = every episode's prompt
    while episodes are running or queued:
        rows from the queue join the decode batch (up to batch_size rows)
        one decode step for every row
        the rows whose turn ended leave: their environment step is submitted (one batched call for
        the rows that ended on the same step, or that waited for a free slot; for an environment
        that needs whole groups, such as the pairwise judge, once every running episode of the
        row's group has ended its turn) and runs on another thread while decoding goes on
        the calls that returned: each episode that goes on joins the queue with its observation
        (the loop waits for a call only when it has nothing to decode)

Environment calls never block the decoder (`posttrain.rollout.env_calls.EnvironmentCalls`): at most
`environment.max_concurrent_steps` are in flight per worker, for environments that may be called
from several threads at once (`concurrent_steps`), else one; ended turns wait for a free slot and go
together (backpressure). Each episode turn samples from a random stream of its own, so the order in
which calls return does not decide which random numbers a row draws.

Where the turn-by-turn loop waits for the batch's longest reply before any environment step, and
for every environment step before the next turn, here a short reply's episode is stepped and
decoding again while long replies are still being written. The sequences, masks, rewards and
bookkeeping are the same functions as the turn-by-turn loop's (`record_turn`, `apply_step`).

With vLLM (`engine_episode_loop`) the engine does the continuous batching: every episode's turn is
one request (`LLMEngine.add_request`), the loop runs the engine step by step, and an episode whose
request finished is stepped by its environment and submits its next turn at once, while the other
requests stay in the engine's running batch. Each turn keeps the token ids and logprobs vLLM sampled.

The loop runs where the model is: in each generation (or colocated policy) worker, on that worker's
share of the episodes (whole groups), calling the environment itself (`SamplerHost.run_on_samplers`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from posttrain.data.trajectory import EpisodeLimits, Trajectory, episode_room, record_turn
from posttrain.environments.interface import EnvStepResult
from posttrain.generation.continuous import ContinuousDecoder
from posttrain.generation.interface import SamplerHost
from posttrain.generation.sampling import SamplingParams, _eos_ids, sampling_seed, turn_seed
from posttrain.rollout.env_calls import EnvironmentCalls, concurrency_bound
from posttrain.rollout.episode import apply_step


def episode_loop(
    model: torch.nn.Module,
    tokenizer: Any,
    trajectories: list[Trajectory],
    environment: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
    seed: int | None = None,
    stream: int = 0,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """Run `trajectories` (fresh episodes, prompts only) to their ends with continuous batching.

    Environment calls run off this thread (`EnvironmentCalls`, at most `concurrency_bound(environment)`
    in flight): the decoder keeps decoding the other episodes while a call waits, and blocks only when
    it has nothing to decode. Turn n of episode k samples from a random stream of its own, seeded
    `sampling_seed(turn_seed(seed, n), stream, k)` (as the vLLM loop's requests), so the order in which
    calls return does not change which random numbers a row draws. Returns the trajectories (the same
    objects, in the same order) and the environment's step results (in submission order)."""
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    decoder = ContinuousDecoder(
        model,
        eos_ids=eos_ids,
        pad_id=pad_id,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        tokenizer=tokenizer,
        room=params.max_new_tokens,
        keep_cache=True,
    )
    seeds = None if seed is None or params.temperature == 0 else (seed, stream)
    queue = list(range(len(trajectories)))
    kept: dict[int, list] = {}  # episode -> the KV cache of its finished turn, while it waits
    waiting: dict[int, tuple] = {}  # episode -> (its ended turn, its cache), until it is submitted
    whole_groups = needs_whole_groups(environment)
    was_training = model.training
    model.eval()
    try:
        with EnvironmentCalls(environment, concurrency_bound(environment)) as calls:
            while queue or len(decoder) or waiting or calls.busy:
                room = max(batch_size - len(decoder), 0)
                joining, queue = queue[:room], queue[room:]
                _join(decoder, trajectories, joining, kept, params, limits, seeds)
                for row in decoder.step():
                    waiting[row.key] = ((row.tokens, row.logprobs, row.finished_by == "length"), row.cache)
                if waiting and calls.room:
                    _submit_ready(calls, waiting, kept, trajectories, whole_groups, tokenizer, limits)
                idle = not len(decoder) and not queue
                if idle and not calls.busy:
                    raise RuntimeError(f"episodes {sorted(waiting)} wait for a step that was never submitted")
                for call, result in calls.finished(block=idle):
                    going_on = _apply_step(call.keys, call.turn_ids, result, trajectories, tokenizer, limits)
                    queue += going_on
                    for k, restarted in zip(call.keys, result.new_context, strict=True):
                        if k not in going_on or restarted:  # a restarted context prefills its new prompt
                            kept.pop(k, None)
            results = calls.results()
    finally:
        model.train(was_training)
    return trajectories, results


def _submit_ready(
    calls: EnvironmentCalls,
    waiting: dict[int, tuple],
    kept: dict[int, list],
    trajectories: list[Trajectory],
    whole_groups: bool,
    tokenizer: Any,
    limits: EpisodeLimits,
) -> None:
    """Record the turns of the waiting episodes that may be stepped now (`ready_to_step`), keep their
    caches, and submit them in one environment call."""
    ready = ready_to_step(list(waiting), trajectories, whole_groups)
    if not ready:
        return
    turns = [waiting[k][0] for k in ready]
    kept.update({k: waiting.pop(k)[1] for k in ready})
    _submit_turns(calls, ready, turns, trajectories, tokenizer, limits)


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
    seeds: tuple[int, int] | None = None,
) -> None:
    """Episodes `keys` join the decode: new ones prefill their prompt, continuing ones run only what
    came after their kept cache (their last sampled token and the observation). With `seeds` (base,
    stream), each row samples from its own stream (`row_generator`)."""

    new = [k for k in keys if k not in kept]
    decoder.add(
        new,
        [trajectories[k].input_ids for k in new],
        [turn_budget(trajectories[k], params, limits) for k in new],
        [turn_stops(trajectories[k], params) for k in new],
        generators=[row_generator(trajectories[k], k, seeds) for k in new],
    )
    going_on = [k for k in keys if k in kept]
    caches = [kept.pop(k) for k in going_on]
    decoder.resume(
        going_on,
        caches,
        [trajectories[k].input_ids[c[0][0].shape[1] :] for k, c in zip(going_on, caches, strict=True)],
        [turn_budget(trajectories[k], params, limits) for k in going_on],
        [turn_stops(trajectories[k], params) for k in going_on],
        generators=[row_generator(trajectories[k], k, seeds) for k in going_on],
    )


def row_generator(t: Trajectory, k: int, seeds: tuple[int, int] | None) -> torch.Generator | None:
    """The random stream of episode k's next turn n (= t.num_turns) on worker `stream`, seeded
    `sampling_seed(turn_seed(base, n), stream, k)` for `seeds` = (base, stream); None unseeded."""
    if seeds is None:
        return None
    base, stream = seeds
    return torch.Generator().manual_seed(sampling_seed(turn_seed(base, t.num_turns), stream, k))


def turn_budget(t: Trajectory, params: SamplingParams, limits: EpisodeLimits) -> int:
    """The most tokens t's next turn may generate: max_new_tokens, or what is left of max_seq_len or
    of the episode token budget."""
    room = episode_room(t, limits.max_episode_tokens)
    return min(params.max_new_tokens, limits.max_seq_len - len(t.input_ids), room)


def turn_stops(t: Trajectory, params: SamplingParams) -> tuple[str, ...]:
    """The stop strings of t's next turn: the configured ones and the episode's own."""
    return tuple(params.stop_strings) + t.stop_strings


def _submit_turns(
    calls: EnvironmentCalls,
    keys: list[int],
    turns: list[tuple[list[int], list[float], bool]],
    trajectories: list[Trajectory],
    tokenizer: Any,
    limits: EpisodeLimits,
) -> None:
    """Record the ended turns ((token ids, logprobs, truncated) of episodes `keys`) and submit their
    episodes' step in one environment call."""
    episodes = [trajectories[k] for k in keys]
    turn_ids = [
        record_turn(t, ids, lps, truncated, tokenizer, limits.max_seq_len, None, limits.max_episode_tokens)
        for t, (ids, lps, truncated) in zip(episodes, turns, strict=True)
    ]
    calls.submit(keys, turn_ids, [t.messages for t in episodes], [t.metadata for t in episodes])


def _apply_step(
    keys: list[int],
    turn_ids: list[list[int]],
    result: EnvStepResult,
    trajectories: list[Trajectory],
    tokenizer: Any,
    limits: EpisodeLimits,
) -> list[int]:
    """Take a returned step of episodes `keys` into their trajectories; returns the episodes that go on."""
    for j, k in enumerate(keys):
        apply_step(trajectories[k], result, j, turn_ids[j], tokenizer, limits)
    return [k for k in keys if not trajectories[k].done]


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
        while requests are pending or environment calls are in flight:
            one engine step (every running request decodes a token, queued ones prefill)
            the requests that finished: record their turns, submit their episodes' step (one
            environment call, off this thread: `EnvironmentCalls`)
            the calls that returned: submit the next turn of each episode that goes on

    Turn n of episode k samples with seed `sampling_seed(turn_seed(params.seed, n), params.seed_stream,
    k)`: its own, whatever the order requests finish in. Returns the trajectories (the same objects, in
    the same order) and the environment's step results."""
    pending: dict[str, tuple[int, tuple[str, ...]]] = {}  # request id -> (episode, its stop strings)
    waiting: dict[int, tuple[list[int], list[float], bool]] = {}  # episode -> its ended turn
    whole_groups = needs_whole_groups(environment)

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
        with EnvironmentCalls(environment, concurrency_bound(environment)) as calls:
            for k in range(len(trajectories)):
                submit(k)
            while pending or waiting or calls.busy:
                if pending and not engine.has_unfinished():
                    raise RuntimeError(
                        f"the vLLM engine finished with {len(pending)} episode turns not reported"
                    )
                for request_id, out in engine.step() if pending else []:
                    k, stops = pending.pop(request_id)
                    waiting[k] = engine.completion(out, stops)
                ready = ready_to_step(list(waiting), trajectories, whole_groups) if calls.room else []
                if ready:
                    _submit_turns(
                        calls, ready, [waiting.pop(k) for k in ready], trajectories, tokenizer, limits
                    )
                if not pending and not calls.busy and waiting:
                    raise RuntimeError(f"episodes {sorted(waiting)} wait for a step that was never submitted")
                for call, result in calls.finished(block=not pending):
                    for k in _apply_step(call.keys, call.turn_ids, result, trajectories, tokenizer, limits):
                        submit(k)
            results = calls.results()
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
    """One worker's episodes with no turn barrier: `sampler` is its HF model (`episode_loop`) or its
    vLLM engine (`engine_episode_loop`); either way a seed per episode turn, worker `stream`."""
    if isinstance(sampler, torch.nn.Module):
        return episode_loop(
            sampler, tokenizer, trajectories, environment, params, batch_size, limits, params.seed, stream
        )
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
    generator: SamplerHost,
    trajectories: list[Trajectory],
    environment: Any,
    params: SamplingParams,
    batch_size: int,
    limits: EpisodeLimits,
) -> tuple[list[Trajectory], list[EnvStepResult]]:
    """`run_episodes` beside every sampler of `generator` (`SamplerHost.run_on_samplers`: each
    generation worker's, or the one model or vLLM engine held in this process, with the generator's
    tokenizer), each with a share of whole groups and seed stream k of its own."""
    pieces = split_by_group(trajectories, generator.num_samplers())
    args = [
        ([trajectories[i] for i in piece], environment, params, batch_size, limits, k)
        for k, piece in enumerate(pieces)
    ]
    done: list[Trajectory] = []
    results: list[EnvStepResult] = []
    for part, part_results in generator.run_on_samplers(run_episodes, args):
        done += part
        results += part_results
    return done, results
