"""Episodes from tasks: reset by the environment, several turns with tool results, masks and limits.

The generator is scripted (replies chosen per call, prompts recorded) because the claims are about
how `run_rollouts` builds sequences and bookkeeping around given replies; the tokenizer and chat
template are SmolLM2's real ones.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posttrain.data.tokenize import encode_prompt, observation_ids
from posttrain.environments.interface import EnvStepResult, EpisodeStart
from posttrain.generation.sampling import GenerationOutput, SamplingParams
from posttrain.rollout.rollout import build_rl_batch, run_rollouts, transcript


class Scripted:
    """Replies `reply_fn(prompt_ids, call_index)` to each prompt; records prompts and stop strings."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.calls: list[tuple[list[list[int]], tuple[str, ...]]] = []

    def generate(self, prompt_ids, params: SamplingParams, batch_size: int) -> GenerationOutput:
        text = self.replies[len(self.calls)]
        self.calls.append(([list(p) for p in prompt_ids], params.stop_strings))
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [
            self.tokenizer.eos_token_id
        ]
        n = len(prompt_ids)
        return GenerationOutput([list(ids)] * n, [[-0.5] * len(ids)] * n, [False] * n)


class Counter:
    """An environment with its own start state: reset puts a counter in the metadata and offers a tool;
    each step answers with two tool messages, until `turns` turns, rewarding 0.25 a turn. Tasks whose
    "broken" field is set are not scorable (scored=False)."""

    def __init__(self, turns: int = 2, long_observation: bool = False) -> None:
        self.turns, self.long_observation = turns, long_observation

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        return [
            EpisodeStart(
                messages=[{"role": "user", "content": f"Count from {t['start']}."}],
                metadata={"count": t["start"], "seed": seed, "broken": t.get("broken", False)},
                stop_strings=("</count>",),
            )
            for t, seed in zip(tasks, seeds, strict=True)
        ]

    def step(self, message_logs, metadata) -> EnvStepResult:
        results = EnvStepResult([], [], [], [])
        for log, meta in zip(message_logs, metadata, strict=True):
            meta = {**meta, "count": meta["count"] + 1}
            done = sum(m["role"] == "assistant" for m in log) >= self.turns
            text = "word " * 300 if self.long_observation else f"now {meta['count']}"
            observation = (
                None
                if done
                else [
                    {"role": "tool", "content": text},
                    {"role": "tool", "content": "second result"},
                ]
            )
            results = EnvStepResult.concat(
                [
                    results,
                    EnvStepResult(
                        [0.25],
                        [observation],
                        [done],
                        [meta],
                        [{}],
                        scored=[not meta["broken"]],
                        stop_strings=[None],
                    ),
                ]
            )
        return results

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {"env/steps": float(len(results))}


def _run(tokenizer, env, replies, tasks, *, max_turns=3, max_seq_len=512, max_observation_tokens=None, g=2):
    generator = Scripted(tokenizer, replies)
    rollouts = run_rollouts(
        tasks,
        generations_per_prompt=g,
        generator=generator,
        environment=env,
        tokenizer=tokenizer,
        params=SamplingParams(stop_strings=("STOP",)),
        batch_size=8,
        max_turns=max_turns,
        max_seq_len=max_seq_len,
        max_observation_tokens=max_observation_tokens,
        first_group_id=10,
    )
    return rollouts, generator


def test_episode_starts_from_reset_and_ids_seen_equal_the_trajectory(tokenizer):
    rollouts, generator = _run(tokenizer, Counter(turns=2), ["one</count>", "two</count>"], [{"start": 3}])
    assert len(rollouts.trajectories) == 2  # G = 2 copies of one reset
    t = rollouts.trajectories[0]
    assert t.metadata["count"] == 5 and t.metadata["seed"] == 10 and t.group_id == 10
    # the environment's per-episode stop strings join the configured ones
    assert generator.calls[0][1] == ("STOP", "</count>")
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "Count from 3."}])
    # turn 1 saw the prompt; turn 2 saw prompt + turn-1 tokens + the two tool messages' tokens
    assert generator.calls[0][0][0] == prompt
    (s1, e1), (s2, e2) = t.turn_spans
    assert s1 == len(prompt) and generator.calls[1][0][0] == t.input_ids[:s2]
    tools = [{"role": "tool", "content": "now 4"}, {"role": "tool", "content": "second result"}]
    assert t.input_ids[e1:s2] == observation_ids(tokenizer, t.input_ids[s1:e1], tools)
    assert e2 == len(t.input_ids)
    # invariant: the loss mask covers exactly the generated tokens
    assert sum(t.loss_mask) == (e1 - s1) + (e2 - s2) == t.response_length
    assert all(t.loss_mask[i] == int(s1 <= i < e1 or s2 <= i < e2) for i in range(len(t.input_ids)))
    assert t.turn_rewards == [0.25, 0.25] and t.reward == 0.5 and t.stop_reason == "done"
    assert t.observation_tokens == s2 - e1
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    m = rollouts.env_metrics
    assert m["episode/turns_mean"] == 2 and m["episode/done_rate"] == 1.0 and m["env/steps"] == 4
    assert m["episode/environment_tokens_mean"] == t.observation_tokens
    row = transcript(t)
    assert row["turns"] == 2 and row["prompt"] == "Count from 3." and len(row["messages"]) == 4


def test_max_turns_and_unscored_episodes(tokenizer):
    tasks = [{"start": 0}, {"start": 7, "broken": True}]
    rollouts, _ = _run(tokenizer, Counter(turns=5), ["a</count>", "b</count>"], tasks, max_turns=2)
    assert [t.stop_reason for t in rollouts.trajectories] == ["max_turns"] * 4
    assert rollouts.scored.tolist() == [True, True, False, False]
    assert rollouts.env_metrics["episode/max_turns_rate"] == 1.0
    assert rollouts.env_metrics["episode/unscored_rate"] == 0.5
    batch = build_rl_batch(rollouts.trajectories, rollouts.rewards, tokenizer.pad_token_id)
    assert batch.loss_mask[:2].sum() > 0 and batch.loss_mask[2:].sum() == 0  # left out, not scored 0


def test_long_observation_is_cut_in_the_middle_and_max_seq_len_truncates(tokenizer):
    rollouts, _ = _run(
        tokenizer,
        Counter(turns=3, long_observation=True),
        ["x</count>"] * 3,
        [{"start": 1}],
        max_observation_tokens=20,
        g=1,
    )
    tool = rollouts.trajectories[0].messages[2]
    assert "tokens cut" in tool["content"] and tool["content"].startswith("word")
    assert len(tokenizer(tool["content"], add_special_tokens=False)["input_ids"]) < 40
    # without the cut, 300 words do not fit in 128 tokens: the episode ends truncated after turn 1
    rollouts, _ = _run(
        tokenizer,
        Counter(turns=3, long_observation=True),
        ["x</count>"] * 3,
        [{"start": 1}],
        max_seq_len=128,
        g=1,
    )
    t = rollouts.trajectories[0]
    assert t.truncated and t.stop_reason == "truncated" and t.num_turns == 1 and len(t.input_ids) < 128


def test_tasks_without_reset_start_from_their_messages(tokenizer):
    class Echo:
        def step(self, message_logs, metadata):
            return EnvStepResult.final(
                [1.0 if m["answer"] == "4" else 0.0 for m in metadata], metadata, [{} for _ in metadata]
            )

        def batch_metrics(self, results):
            return {}

    task = {"messages": [{"role": "user", "content": "2 + 2?"}], "answer": "4", "level": 1}
    rollouts, generator = _run(tokenizer, Echo(), ["4"], [task], g=3)
    assert generator.calls[0][0][0] == encode_prompt(tokenizer, task["messages"])
    assert [t.reward for t in rollouts.trajectories] == [1.0] * 3
    assert rollouts.trajectories[0].metadata == {"answer": "4", "level": 1}


def test_tools_are_written_into_the_system_prompt_for_templates_without_tool_support(tokenizer):
    schema = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {}}}

    class WithTools(Counter):
        def reset(self, tasks, seeds):
            return [
                EpisodeStart(
                    [{"role": "user", "content": "hi"}], {"count": 0, "broken": False}, tools=[schema]
                )
                for _ in tasks
            ]

    rollouts, generator = _run(tokenizer, WithTools(turns=1), ["done"], [{"start": 0}], g=1)
    system = rollouts.trajectories[0].messages[0]
    assert system["role"] == "system" and '"name": "add"' in system["content"]
    assert tokenizer.decode(generator.calls[0][0][0]).count('"name": "add"') == 1


def test_a_prompt_longer_than_max_seq_len_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="max_seq_len"):
        _run(tokenizer, Counter(), ["x"], [{"start": 1}], max_seq_len=8)


@pytest.mark.parametrize("env_name", ["counter", "sliding_puzzle", "sliding_puzzle_board_only"])
def test_continuous_episodes_equal_turn_by_turn_when_greedy(tmp_path_factory, tokenizer, env_name):
    """Without a turn barrier episodes decode in one continuous batch, joining and leaving as their
    turns end; greedy decoding gives every row the tokens it gets alone, so both loops build the same
    trajectories (ids, masks, logprobs to fp32 rounding, rewards, turns). Tiny random model, real
    environments (the sliding puzzle's observations differ by reply)."""
    from conftest import make_tiny_model_dir

    from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment
    from posttrain.generation.text_generation import LocalGenerator

    # a wide init: greedy replies differ by prompt and in length (no near-ties between tokens)
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("wide"), tokenizer, initializer_range=0.1)
    generator = LocalGenerator(str(model_dir), tokenizer, backend="hf", device="cpu")
    if env_name == "counter":
        env, tasks = Counter(turns=3), [{"start": 1}, {"start": 2}]
    else:  # board_only: every turn restarts the conversation (the continuous decode drops its cache)
        env = SlidingPuzzleEnvironment(max_moves=3, history=env_name == "sliding_puzzle")
        tasks = env.generate_tasks(2, seed=5)
    out = {}
    for barrier in (True, False):
        out[barrier] = run_rollouts(
            tasks,
            generations_per_prompt=2,
            generator=generator,
            environment=env,
            tokenizer=tokenizer,
            # stop strings a random model's text soon contains, so that turns end and episodes go on
            params=SamplingParams(temperature=0.0, max_new_tokens=10, stop_strings=("e", "a", "o")),
            batch_size=3,  # fewer rows than episodes: later episodes join as others leave
            max_turns=3,
            max_seq_len=400,
            turn_barrier=barrier,
        )
    for a, b in zip(out[True].trajectories, out[False].trajectories, strict=True):
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        assert a.turn_spans == b.turn_spans and a.turn_rewards == b.turn_rewards
        assert a.stop_reason == b.stop_reason and a.messages == b.messages
        assert [c.input_ids for c in a.contexts] == [c.input_ids for c in b.contexts]
        assert len(a.contexts) == (0 if env_name != "sliding_puzzle_board_only" else a.num_turns - 1)
        torch.testing.assert_close(
            torch.tensor(a.generation_logprobs), torch.tensor(b.generation_logprobs), rtol=0, atol=1e-5
        )
    assert sum(t.num_turns for t in out[False].trajectories) > len(
        out[False].trajectories
    )  # several turns ran


def test_response_prefix_starts_every_turn_unmasked_and_is_in_the_message(tokenizer):
    """An environment's response prefix ("<count>") follows the prompt and every observation with
    loss mask 0; the assistant messages the environment reads hold prefix + reply."""

    class Prefixed(Counter):
        def reset(self, tasks, seeds):
            return [
                EpisodeStart(s.messages, s.metadata, stop_strings=s.stop_strings, response_prefix="<count>")
                for s in super().reset(tasks, seeds)
            ]

    rollouts, generator = _run(
        tokenizer, Prefixed(turns=2), ["one</count>", "two</count>"], [{"start": 0}], g=1
    )
    t = rollouts.trajectories[0]
    prefix = tokenizer("<count>", add_special_tokens=False)["input_ids"]
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "Count from 0."}])
    assert generator.calls[0][0][0] == prompt + prefix
    (s1, e1), (s2, _) = t.turn_spans
    assert s1 == len(prompt) + len(prefix) and t.input_ids[s2 - len(prefix) : s2] == prefix
    assert t.loss_mask[s2 - len(prefix) : s2] == [0] * len(prefix)
    assert [m["content"] for m in t.messages if m["role"] == "assistant"] == [
        "<count>one</count>",
        "<count>two</count>",
    ]


@pytest.mark.parametrize(
    ("tool_choice", "forced"),
    [("required", "<tool_call>\n"), ("calculator", '<tool_call>\n{"name": "calculator", "arguments": {')],
)
def test_tool_choice_prefixes_only_the_first_turn(tokenizer, tool_choice, forced):
    """`tool_choice` "required" / a tool's name: the first turn continues after the forced opening of
    a call (loss mask 0); the environment's step drops the prefix (`response_prefixes=[""]`), so the
    turn after the tool's result starts free. Real calculator environment, scripted replies."""
    from posttrain.environments.calculator import CalculatorEnvironment

    env = CalculatorEnvironment(tool_choice=tool_choice, tools_in_system_prompt=True)
    task = {"a": 347, "b": 58}
    whole_call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n</tool_call>'
    call = whole_call.removeprefix(forced)
    rollouts, generator = _run(tokenizer, env, [call, "The answer is \\boxed{20126}."], [task], g=1)
    t = rollouts.trajectories[0]
    prefix = tokenizer(forced, add_special_tokens=False)["input_ids"]
    first_prompt, second_prompt = generator.calls[0][0][0], generator.calls[1][0][0]
    assert first_prompt[-len(prefix) :] == prefix
    (s1, e1), (s2, _) = t.turn_spans
    assert t.loss_mask[s1 - len(prefix) : s1] == [0] * len(prefix)
    assert second_prompt == t.input_ids[:s2] and second_prompt[-len(prefix) :] != prefix
    assert tokenizer.decode(t.input_ids[e1:s2]).endswith("<|im_start|>assistant\n")  # no prefix
    replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
    assert replies == [whole_call, "The answer is \\boxed{20126}."]
    assert t.messages[-2]["role"] == "tool" and t.messages[-2]["content"] == "20126"
    assert t.reward == 1.0 and t.info["called_tool"] is True


def test_tool_choice_must_name_a_tool():
    from posttrain.environments.calculator import CalculatorEnvironment

    with pytest.raises(ValueError, match="tool_choice must be 'auto', 'required' or a tool's name"):
        CalculatorEnvironment(tool_choice="calculater")


def test_transcript_of_an_episode_with_worked_examples_starts_at_the_task(tokenizer):
    """Worked examples before the task are prompt, not episode: the transcript's prompt is the task's
    question and its messages begin with the episode's first reply."""
    from posttrain.environments.calculator import CalculatorEnvironment, product_prompt

    shot = [
        {"role": "user", "content": product_prompt(12, 34)},
        {"role": "assistant", "content": "The answer is \\boxed{408}."},
    ]
    env = CalculatorEnvironment(examples=shot, describe_tools=False)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n</tool_call>'
    rollouts, _ = _run(tokenizer, env, [call, "\\boxed{20126}"], [{"a": 347, "b": 58}], g=1)
    row = transcript(rollouts.trajectories[0])
    assert row["prompt"] == product_prompt(347, 58)
    assert row["messages"][0] == {"role": "assistant", "content": call}
    assert row["completion"] == "\\boxed{20126}" and row["turns"] == 2 and row["reward"] == 1.0


# --- max_observation_tokens is a hard cap, marker included (issue #29, item 7) --------------------


def _content_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_cut_middle_is_a_hard_cap_marker_included(tokenizer):
    from posttrain.data.trajectory import cut_middle

    long = {"role": "tool", "content": "word " * 300}  # SmolLM2: "word", 299 x " word", " ": 301 tokens
    # limit 20: the marker "\n[... 293 tokens cut ...]\n" is 12 tokens (digits one token each), so 8
    # tokens of the text stay: 4 from the start, 4 from the end; 4 + 12 + 4 = 20 (before: 20 + marker)
    cut = cut_middle(tokenizer, long, 20)["content"]
    assert cut == "word word word word\n[... 293 tokens cut ...]\n word word word "
    assert _content_tokens(tokenizer, cut) == 20
    # limit 4: the long marker does not fit, the short one "\n[...]\n" (4 tokens) does (before: 16)
    assert cut_middle(tokenizer, long, 4)["content"] == "\n[...]\n"
    # for any limit and text the content stays within it
    texts = ["word " * 300, "1234567890" * 40, "naïve café – 日本語のテキスト " * 30, "x" * 500]
    for text in texts:
        for limit in [1, 2, 3, 5, 7, 11, 12, 13, 17, 33, 64]:
            out = cut_middle(tokenizer, {"role": "tool", "content": text}, limit)["content"]
            assert _content_tokens(tokenizer, out) <= limit, (text[:10], limit, out)


def test_cut_observation_caps_the_messages_together(tokenizer):
    from posttrain.data.trajectory import cut_observation

    long = {"role": "tool", "content": "word " * 300}
    short = {"role": "tool", "content": "second result"}  # 2 tokens: kept whole
    out = cut_observation(tokenizer, [long, short], 20)
    assert out[1] == short
    assert [_content_tokens(tokenizer, m["content"]) for m in out] == [18, 2]
    # two long messages share the 20 tokens: 10 each (before: each got 20 plus its marker)
    out = cut_observation(tokenizer, [long, long], 20)
    assert [_content_tokens(tokenizer, m["content"]) for m in out] == [10, 10]
    assert all(m["content"].startswith("word") and "[...]" in m["content"] for m in out)
    assert cut_observation(tokenizer, [long, short], None) == [long, short]
    assert cut_observation(tokenizer, [short, short], 4) == [short, short]  # fits: untouched


def test_an_episode_observation_stays_within_max_observation_tokens(tokenizer):
    # Counter's observation: "word " * 300 and "second result", two tool messages
    rollouts, _ = _run(
        tokenizer,
        Counter(turns=2, long_observation=True),
        ["x</count>"] * 2,
        [{"start": 1}],
        max_observation_tokens=12,
        g=1,
    )
    tools = [m for m in rollouts.trajectories[0].messages if m["role"] == "tool"]
    assert sum(_content_tokens(tokenizer, m["content"]) for m in tools) <= 12
    assert tools[1]["content"] == "second result"


# --- the episode token budget bounds the generated tokens over all turns (issue #29, item 4) ------


@pytest.mark.parametrize("barrier", [True, False])
def test_an_episode_ends_truncated_at_its_token_budget(tiny_model_dir, tokenizer, barrier):
    # a random model writes 10-token turns (max_new_tokens); budget 15: turn 1 takes 10, turn 2 is cut
    # at 5 (turn by turn: cut after generation; continuous: the decoder's own budget), and the
    # episode ends there, truncated, though the environment wants 3 turns
    from posttrain.generation.text_generation import LocalGenerator

    generator = LocalGenerator(str(tiny_model_dir), tokenizer, backend="hf", device="cpu")
    rollouts = run_rollouts(
        [{"start": 1}, {"start": 2}],
        generations_per_prompt=2,
        generator=generator,
        environment=Counter(turns=3),
        tokenizer=tokenizer,
        params=SamplingParams(temperature=1.0, max_new_tokens=10, seed=0),
        batch_size=8,
        max_turns=3,
        max_seq_len=400,
        turn_barrier=barrier,
        max_episode_tokens=15,
    )
    for t in rollouts.trajectories:
        assert [e - s for s, e in t.turn_spans] == [10, 5] and t.response_length == 15
        assert t.truncated and t.stop_reason == "truncated" and len(t.turn_rewards) == 2


class Restarting:
    """An environment whose every observation is a whole new conversation (`new_context`): "Count from
    n." with the count moved on, 0.25 a turn, done after `turns` turns."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        return [
            EpisodeStart([{"role": "user", "content": f"Count from {t['start']}."}], {"count": t["start"]})
            for t in tasks
        ]

    def step(self, message_logs, metadata) -> EnvStepResult:
        metadata = [{**m, "count": m["count"] + 1} for m in metadata]
        done = [sum(m["role"] == "assistant" for m in log) >= self.turns for log in message_logs]
        observations = [
            None if d else {"role": "user", "content": f"Count from {m['count']}."}
            for m, d in zip(metadata, done, strict=True)
        ]
        n = len(metadata)
        return EnvStepResult([0.25] * n, observations, done, metadata, new_context=[not d for d in done])

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        return {}


def test_a_new_context_starts_the_next_turn_from_the_observation_alone(tokenizer):
    from posttrain.rollout.rollout import context_rows

    rollouts, generator = _run(tokenizer, Restarting(turns=3), ["a", "bb", "ccc"], [{"start": 3}], g=1)
    [t] = rollouts.trajectories
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": f"Count from {n}."}]) for n in (3, 4, 5)]
    # each turn's generator saw only its own prompt: no earlier turn's tokens
    assert [call[0][0] for call in generator.calls] == prompts
    assert len(t.contexts) == 2 and t.num_turns == 3 and t.reward == 0.75
    replies = [list(tokenizer(r, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
               for r in ("a", "bb", "ccc")]  # fmt: skip
    sequences = [(c.input_ids, c.loss_mask) for c in t.contexts] + [(t.input_ids, t.loss_mask)]
    for (ids, mask), prompt, reply in zip(sequences, prompts, replies, strict=True):
        assert ids == prompt + reply and mask == [0] * len(prompt) + [1] * len(reply)
    assert t.response_length == sum(len(r) for r in replies)  # over all contexts
    assert t.observation_tokens == len(prompts[1]) + len(prompts[2])
    # the whole conversation stays in the messages (for the environment and the transcripts)
    assert [m["role"] for m in t.messages] == ["user", "assistant"] * 3
    rows, episode_of = context_rows(rollouts.trajectories)
    assert [r.input_ids for r in rows] == [s[0] for s in sequences] and episode_of.tolist() == [0, 0, 0]
    assert [r.turn_spans for r in rows] == [
        [(len(p), len(p) + len(r))] for p, r in zip(prompts, replies, strict=True)
    ]
    assert all(r.reward == 0.75 and not r.contexts for r in rows)
    batch = build_rl_batch(rows, None, 0)
    assert batch.loss_mask.sum().item() == t.response_length
    with pytest.raises(Exception, match="several token sequences"):
        build_rl_batch(rollouts.trajectories, None, 0)
