"""Sliding puzzle oracle transcripts (the SFT warm start's data) replayed through the environment, the
script that writes them, the first-move and blind-baseline metrics, and (slow: the real tokenizer)
the SFT tokens of a transcript against the tokens of the same GRPO episode."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

from posttrain.environments.sliding_puzzle import SlidingPuzzleEnvironment, oracle_transcript
from posttrain.environments.sliding_puzzle_board import (
    apply_action,
    boards_near_goal,
    is_heldout,
    oracle_moves,
    render,
    solution_length,
    solved_grid,
    task_grid,
)

SCRIPT = Path(__file__).parents[2] / "examples" / "sliding_puzzle_transcripts.py"
ONE_UP = [[1, 2, 3], [4, 5, 0], [7, 8, 6]]
ONE_LEFT = [[1, 2, 3], [4, 5, 6], [7, 0, 8]]


def env_of(**kwargs: Any) -> SlidingPuzzleEnvironment:
    return SlidingPuzzleEnvironment(
        **{"min_size": 2, "max_size": 3, "max_shuffle_moves": 15, "max_moves": 20, **kwargs}
    )


def replay(env: SlidingPuzzleEnvironment, task: dict, messages: list[dict]) -> tuple[dict, dict]:
    """Play the transcript's assistant turns through `reset` and `step`, checking that its first
    messages and observations are the environment's own and that every move brings the board one move
    closer to solved. Returns the last turn's info and metadata."""
    [start] = env.reset([task], [0])
    assert messages[: len(start.messages)] == start.messages
    turns = messages[len(start.messages) :]
    assert [m["role"] for m in turns] == ["assistant", "user"] * (len(turns) // 2) + ["assistant"]
    log, meta, info = list(start.messages), start.metadata, {}
    for k in range(0, len(turns), 2):
        log.append(turns[k])
        before = solution_length(meta["grid"], int(task["shuffle_moves"]))
        result = env.step([log], [meta])
        meta, info = result.metadata[0], result.info[0]
        assert info["outcome"] == "moved" and solution_length(meta["grid"], before) == before - 1
        if k + 1 < len(turns):  # the transcript goes on with the environment's own observation
            assert not result.done[0] and turns[k + 1] == result.observations[0]
            log.append(turns[k + 1])
    return info, meta


@pytest.mark.parametrize("redraw", [False, True])
def test_full_transcripts_replay_to_solved_with_the_environment_s_own_observations(redraw: bool) -> None:
    env = env_of(redraw_board=redraw, action_prefix=True)
    tasks = env.generate_tasks(40, seed=2)
    for task in tasks:
        messages = oracle_transcript(env, task, hide_heldout=False)
        info, meta = replay(env, task, messages)
        assert info["solved"]
        moves = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(moves) == solution_length(task_grid(task), int(task["shuffle_moves"]))
        assert moves == [
            f"<action>{m}</action>" for m in oracle_moves(task_grid(task), int(task["shuffle_moves"]))
        ]
    # the first message is the environment's, and observations (redrawn or not) are its own
    assert messages[0] == env.reset([task], [0])[0].messages[0]


def test_training_transcripts_never_show_a_held_out_board() -> None:
    env = env_of(redraw_board=True)
    heldout_renders = [
        render([list(key[r * n : (r + 1) * n]) for r in range(n)])
        for n in (2, 3)
        for key, d in boards_near_goal(n, 15).items()
        if d <= 9 and is_heldout([list(key[r * n : (r + 1) * n]) for r in range(n)])
    ]
    solved = cut = 0
    for task in env.generate_tasks(120, seed=5, split="train"):
        messages = oracle_transcript(env, task)
        info, meta = replay(env, task, messages)
        text = "\n".join(m["content"] for m in messages)
        assert not any(board in text for board in heldout_renders)
        if info["solved"]:
            solved += 1
        else:  # stopped after the move that reached a held-out board, before its observation
            assert is_heldout(meta["grid"]) and messages[-1]["role"] == "assistant"
            cut += 1
    assert solved and cut  # both endings occur
    with pytest.raises(ValueError, match="starts from a held-out board"):
        oracle_transcript(env, env.generate_tasks(1, seed=0, split="heldout")[0])


def test_oracle_moves_prefer_training_boards() -> None:
    # 8 moves from solved, with shortest solutions that begin `down` (to a held-out board) or `left`
    board = [[1, 2, 3], [8, 7, 5], [0, 4, 6]]
    first = oracle_moves(board, 8)
    assert len(first) == 8 and first[0] == "down"  # the first shortest move in direction order
    assert is_heldout(apply_action(board, "down")[0])
    preferring = oracle_moves(board, 8, prefer_train=True)
    assert len(preferring) == 8 and preferring[0] == "left"
    assert not is_heldout(apply_action(board, "left")[0])
    for moves in (first, preferring):
        grid = board
        for move in moves:
            grid = apply_action(grid, move)[0]
        assert grid == solved_grid(3)
    with pytest.raises(ValueError, match="more than 7 moves"):
        oracle_moves(board, 7)


def test_the_script_writes_sft_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = runpy.run_path(str(SCRIPT), run_name="sliding_puzzle_transcripts")
    out = tmp_path / "sft.jsonl"
    kwargs = {
        "min_size": 3,
        "max_size": 3,
        "max_shuffle_moves": 5,
        "redraw_board": True,
        "action_prefix": True,
    }
    script["main"]([str(out), "--count", "12", "--seed", "3", "--env", json.dumps(kwargs)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and "wrote 12 transcripts (" in capsys.readouterr().out
    env = SlidingPuzzleEnvironment(**kwargs)
    assert [r["task"] for r in rows] == env.generate_tasks(12, 3, split="train")
    for row in rows:
        assert row["messages"] == oracle_transcript(env, row["task"])
    held = tmp_path / "heldout.jsonl"
    script["main"]([str(held), "--count", "4", "--split", "heldout", "--env", json.dumps(kwargs)])
    for row in map(json.loads, held.read_text().splitlines()):
        assert row["task"]["split"] == "heldout"
        assert replay(env, row["task"], row["messages"])[0]["solved"]  # played to the end


# --- metrics -------------------------------------------------------------------------------------


def first_turns(env: SlidingPuzzleEnvironment, grids: list, replies: list[str], max_moves: int = 6):
    metas = [{"size": 3, "grid": g, "moves": 0, "max_moves": max_moves, "shuffle_moves": 5} for g in grids]
    logs = [[{"role": "user", "content": "play"}, {"role": "assistant", "content": r}] for r in replies]
    return env.step(logs, metas)


def test_first_move_optimal_and_blind_baseline_metrics() -> None:
    env = SlidingPuzzleEnvironment(blind_baseline=True, max_moves=6)
    grids = [ONE_UP, ONE_LEFT, ONE_LEFT, [[1, 2, 3], [4, 0, 5], [7, 8, 6]]]
    # up solves ONE_UP; up is illegal on ONE_LEFT; left solves it; left on the two-away board is one
    # of its two shortest first moves
    result = first_turns(
        env,
        grids,
        ["<action>up</action>", "<action>up</action>", "<action>left</action>", "<action>left</action>"],
    )
    assert [i["first_move_optimal"] for i in result.info] == [True, False, True, True]
    assert result.info[0]["start_grid"] == ONE_UP and result.info[0]["max_moves"] == 6
    metrics = env.batch_metrics(result)
    assert metrics["env/first_move_optimal_rate"] == 3 / 4
    # `slide 3 3` solves ONE_UP and ONE_LEFT at once; the two-away board takes two more moves
    assert metrics["env/blind_solved_rate"] == 1.0
    # a later turn says nothing about the first move; without blind_baseline, no start board
    later = env.step(
        [[{"role": "user", "content": "play"}, {"role": "assistant", "content": "<action>up</action>"}]],
        [{"size": 3, "grid": ONE_UP, "moves": 2, "max_moves": 6, "shuffle_moves": 5}],
    )
    assert "first_move_optimal" not in later.info[0]
    plain = first_turns(SlidingPuzzleEnvironment(), grids[:1], ["<action>view</action>"])
    assert plain.info[0]["first_move_optimal"] is False and "start_grid" not in plain.info[0]
    assert "env/blind_solved_rate" not in SlidingPuzzleEnvironment().batch_metrics(plain)
    with pytest.raises(ValueError, match="at most 10"):
        SlidingPuzzleEnvironment(blind_baseline=True, max_moves=11)


# --- tokens (slow: the real tokenizer) -----------------------------------------------------------


@pytest.mark.slow
def test_sft_tokens_are_the_grpo_episode_s_tokens(tokenizer) -> None:
    """A transcript under `posttrain sft` (chat template, assistant tokens trained) is token for token
    the sequence a GRPO episode with action_prefix builds (prompt, "<action>" given, the reply as
    generated, the observation's tokens), and trains every token GRPO trains; SFT also trains the
    "<action>" prefix and each turn's end-of-turn marker, which GRPO gives the model."""
    from posttrain.data.tokenize import encode_prompt, observation_ids, tokenize_conversation

    env = env_of(min_size=3, redraw_board=True, action_prefix=True)
    task = next(t for t in env.generate_tasks(50, seed=1) if solution_length(task_grid(t), 15) >= 3)
    messages = oracle_transcript(env, task, hide_heldout=False)
    sft = tokenize_conversation(tokenizer, messages)

    [start] = env.reset([task], [0])
    prefix = tokenizer(start.response_prefix, add_special_tokens=False)["input_ids"]
    ids = encode_prompt(tokenizer, start.messages) + prefix
    trained = [0] * len(ids)
    turns = messages[len(start.messages) :]
    for k in range(0, len(turns), 2):
        reply = turns[k]["content"][len(start.response_prefix) :]  # what the model generates
        generated = tokenizer(reply, add_special_tokens=False)["input_ids"]
        ids, trained = ids + generated, trained + [1] * len(generated)
        if k + 1 < len(turns):
            extra = observation_ids(tokenizer, generated, turns[k + 1]) + prefix
            ids, trained = ids + extra, trained + [0] * len(extra)
    assert sft.input_ids[: len(ids)] == ids
    assert tokenizer.decode(sft.input_ids[len(ids) :]) == "<|im_end|>\n"  # the last turn's end
    trained += [0] * (len(sft.input_ids) - len(ids))
    assert all(s >= g for s, g in zip(sft.loss_mask, trained, strict=True))  # all GRPO trains, and:
    extra = [sft.input_ids[i] for i, (s, g) in enumerate(zip(sft.loss_mask, trained, strict=True)) if s > g]
    moves = (len(turns) + 1) // 2
    assert tokenizer.decode(extra) == "<action>" + "<|im_end|>\n<action>" * (moves - 1) + "<|im_end|>\n"
