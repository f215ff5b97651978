"""The sliding puzzle game (the n×n "15 puzzle"), played over several turns with `<action>…</action>`.

Rules follow NeMo RL's sliding puzzle: the board starts solved (tiles 1..n²-1 in reading order, the
empty square bottom right) and is shuffled by an ODD number of random legal moves, so it never
starts solved (every legal move moves the empty square to a cell of the other colour of a
checkerboard; after an odd number of moves it cannot be back in its corner). Each turn the model
writes one action inside `<action>…</action>`:

- `up`, `down`, `left`, `right`: slide the tile next to the empty square in that direction
  (`up` moves the tile below the empty square up);
- `slide r c`: slide the tile at row r, column c (1-based) into the adjacent empty square;
- `view`: show the board, no move.

Reward 1 on the turn that solves the puzzle (the episode ends). Every turn counts towards
`max_moves` (a move, a view, an illegal or a malformed action alike), so an episode has at most
`max_moves` turns; an episode that runs out ends unsolved with reward 0, or, with
`shaped_reward > 0`, `shaped_reward` × the fraction of tiles in place. A malformed or illegal
action is an explanatory observation (what went wrong, the legal moves, the format), never an error.

The game is a handful of pure functions on a grid (a list of rows, 0 = the empty square), so a
BFS oracle and tests can use them; `SlidingPuzzleEnvironment` is the batched environment.

Around the game (docs/environments.md#sliding-puzzle-on-3x3-boards):

- **Held-out boards** (`is_heldout`): a board and its `mirror` (reflected in the main diagonal) are
  the same number of moves from solved and go to different pools, so `generate_tasks(..., split=)`
  draws "train" and "heldout" tasks that never share a board, half of the boards at every distance.
- **Blind baseline** (`best_blind_sequence`): the best fixed action sequence for a set of boards,
  found by enumeration: what a policy that never reads the board solves.
- **Relabelled tiles** (`relabel_tiles`, with `goal_board`): each task shows its tiles under a random
  labelling, the goal drawn as a board, so the move cannot be read off how the board looks.
- **Oracle transcripts** (`oracle_transcript`): the conversation of an optimal player through the
  environment's own reset and step, for an SFT warm start (examples/sliding_puzzle_transcripts.py).
- **Checked transcripts** (`checked_transcript`): a player that writes, before each move, where the
  empty square is and whether each move brings its tile closer to home (`written_check`), then plays
  the first move that does (`greedy_move`): a procedure to learn in place of a lookup of boards.
- **Board formats** (`board_format`): a board drawn as a grid (`render`) or written one line per cell,
  `row r, column c: tile` (`render_cells`), where a cell is found by its written coordinates.
- **The current board only** (`history=False`): every turn restarts the conversation from the first
  message written for the current board (`EnvStepResult.new_context`); `turn_contexts` cuts a
  transcript into the rows such an episode's turns see.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar

from posttrain.environments.interface import (
    EnvStepResult,
    EpisodeStart,
    Message,
    last_assistant_content,
    register_environment,
)
from posttrain.environments.sliding_puzzle_board import (
    BOARD_FORMATS,
    SPLITS,
    Grid,
    IllegalMove,
    apply_action,
    blind_solved_rate,
    check_labels,
    hidden_from_training,
    is_heldout,
    is_solved,
    legal_directions,
    move_is_optimal,
    oracle_moves,
    random_labels,
    render_board,
    shuffled_grid,
    solution_length,
    solved_grid,
    task_grid,
    tiles_in_place,
)
from posttrain.environments.sliding_puzzle_check import greedy_move, written_check

STOP_STRINGS = ("</action>",)
MAX_BLIND_MOVES = 10
"""The longest budget `SlidingPuzzleEnvironment(blind_baseline=True)` enumerates blind sequences for."""
MAX_DRAWS_PER_TASK = 200
"""`generate_tasks` gives up after this many draws per task asked for (a split or a minimum distance
that almost no board meets)."""


def parse_action(text: str) -> str | None:
    """The content of the last `<action>…</action>` (case-insensitive, stripped, lower-cased); a last
    tag left open at the end of the text (the closing tag cut as a stop string) counts too. None
    when there is no tag."""
    lower = text.lower()
    start = lower.rfind("<action>")
    if start < 0:
        return None
    start += len("<action>")
    end = lower.find("</action>", start)
    return lower[start : end if end >= 0 else len(lower)].strip()


def instructions(
    grid: Grid, labels: list[int] | None = None, goal_board: bool = False, board_format: str = "grid"
) -> str:
    """The first user message: the rules, the goal (in words, or with `goal_board` drawn as a board:
    needed when the tiles are relabelled), the board (in `board_format`) and the action format."""
    size = len(grid)
    if goal_board:
        goal = f"Goal: make the board look like this:\n{render_board(solved_grid(size), labels, board_format)}\n\n"
    else:
        goal = (
            f"Goal: the tiles 1 to {size * size - 1} in order, left to right and top to bottom, "
            f"with the empty square (_) in the bottom right corner.\n\n"
        )
    return (
        f"Let's play the sliding puzzle on a {size}x{size} board.\n"
        f"{goal}"
        f"Board:\n{render_board(grid, labels, board_format)}\n\n"
        "Each turn, make one move by sliding a tile next to the empty square into it:\n"
        "- up, down, left, right: slide a tile in that direction (up moves the tile below the empty "
        "square up)\n"
        "- slide r c: slide the tile at row r, column c (e.g. slide 1 2)\n"
        "- view: show the board again\n"
        "Think briefly, then give exactly one action like this: <action>up</action>"
    )


@register_environment("sliding_puzzle")
class SlidingPuzzleEnvironment:
    """The sliding puzzle as a multi-turn environment (see the module docstring for the rules).

    Tasks are `{"size": int, "shuffle_moves": int, "puzzle_seed": int}` (from `generate_tasks`, with
    "split" when drawn from one pool); `reset` turns each into its board deterministically, so a fixed
    list of tasks is a fixed evaluation set, and `generate_tasks(..., split="heldout")` one that shares
    no board with `split="train"` tasks (`is_heldout`).
    A task without "puzzle_seed" takes the episode's seed; a task's "max_moves" can lower the
    environment's `max_moves`, never raise it (the config checks `max_moves` against `environment.max_turns`).

    Args:
        min_size, max_size: board sizes drawn by `generate_tasks` (inclusive).
        max_shuffle_moves: `generate_tasks` draws the shuffle length in 1..max_shuffle_moves and
            makes it odd (adds 1 to an even draw), as NeMo RL does.
        min_solution_moves: `generate_tasks` draws again a board that a shorter solution solves (1:
            every board; 3 with max_shuffle_moves=5: boards 3 or 5 moves from solved).
        max_moves: turns per episode (every action counts, see the module docstring).
        redraw_board: show the board after every turn (otherwise only after `view` or a malformed
            action, as in NeMo RL).
        shaped_reward: weight of the tiles-in-place fraction given when an episode ends unsolved
            (0 = off); in [0, 1], so an unsolved board (at most (n² - 2) / (n² - 1) of its tiles in
            place) always pays less than solving.
        action_prefix: begin every assistant turn with "<action>" (the episode's response prefix,
            not generated), so the model writes only the move. A small model that never writes the
            tag itself (SmolLM2-135M-Instruct: 1 reply in 256 at temperature 1) then explores moves
            from the first step.
        goal_board: the first message draws the goal as a board ("make the board look like this")
            instead of describing it in words.
        relabel_tiles: `generate_tasks` gives every task a random relabelling of its tiles ("labels",
            never the identity; needs `goal_board`): the player sees tile t as labels[t - 1] on the
            board, in the goal and in the observations, and must compare the two boards to know which
            tiles are out of place. The board's state, rules, solver and splits are those of the
            tiles 1..n²-1. A task's own "labels" is used with or without this flag (it then also
            needs `goal_board`); a task without one shows the tiles as they are.
        blind_baseline: `batch_metrics` also reports `env/blind_solved_rate`, the solved rate of the
            best fixed action sequence (`best_blind_sequence`) on the boards that the batch's
            episodes started from, within each episode's `max_moves` (at most `MAX_BLIND_MOVES`: the
            enumeration grows with the budget).
        board_format: how every board is written: "grid" (rows drawn in a frame, `render`) or
            "cells" (one `row r, column c: tile` line per cell, `render_cells`), where reading a cell
            is a lookup of its written coordinates rather than a count along a row.
        history: show the player the whole conversation (True, the default), or (False) only the
            current board: after every turn the conversation restarts (`EnvStepResult.new_context`)
            from the first message written for the board the move left (`instructions`), so every
            turn is read as the first one is. The game is fully observed: the board is all a
            player needs. What the last move did (moved, illegal) is then not said.

    Metadata (the episode state, passed back to every `step`): "grid", "moves" (turns taken),
    "max_moves". Info per turn: "action" (parsed, or None), "outcome" ("moved", "view",
    "illegal", "no_action"), "solved", "moves"; on the first turn also "first_move_optimal" (the turn
    moved the board one move closer to solved: `move_is_optimal`; None when unknown) and, with
    `blind_baseline`, "start_grid" and "max_moves".
    """

    turn_limit_kwarg: ClassVar[str] = "max_moves"
    """`environment.max_turns` must be at least `max_moves` (checked by the config): see `episode_turn_limit`."""

    def __init__(
        self,
        min_size: int = 2,
        max_size: int = 3,
        max_shuffle_moves: int = 15,
        max_moves: int = 50,
        redraw_board: bool = False,
        shaped_reward: float = 0.0,
        action_prefix: bool = False,
        min_solution_moves: int = 1,
        blind_baseline: bool = False,
        goal_board: bool = False,
        relabel_tiles: bool = False,
        board_format: str = "grid",
        history: bool = True,
    ) -> None:
        if not 2 <= min_size <= max_size:
            raise ValueError(f"need 2 <= min_size <= max_size, got min_size={min_size} max_size={max_size}")
        if max_shuffle_moves < 1 or max_moves < 1:
            raise ValueError("max_shuffle_moves and max_moves must be >= 1")
        if not 0.0 <= shaped_reward <= 1.0:
            raise ValueError(
                f"shaped_reward must be in [0, 1], got {shaped_reward}: above 1 an episode that runs out "
                "unsolved could pay more than solving the puzzle (1)"
            )
        longest = max_shuffle_moves + 1 - max_shuffle_moves % 2
        if not 1 <= min_solution_moves <= longest:
            raise ValueError(
                f"min_solution_moves must be in 1..{longest} (the longest shuffle: no board is further from "
                f"solved), got {min_solution_moves}"
            )
        if blind_baseline and max_moves > MAX_BLIND_MOVES:
            raise ValueError(
                f"blind_baseline enumerates action sequences of max_moves={max_moves} moves; at most "
                f"{MAX_BLIND_MOVES} are allowed"
            )
        self.min_size = min_size
        self.max_size = max_size
        self.max_shuffle_moves = max_shuffle_moves
        self.max_moves = max_moves
        self.redraw_board = redraw_board
        self.shaped_reward = shaped_reward
        self.action_prefix = action_prefix
        if relabel_tiles and not goal_board:
            raise ValueError(
                "relabel_tiles needs goal_board=true: with relabelled tiles the goal in words ('the tiles "
                "1 to 8 in order') is not the board to reach"
            )
        if board_format not in BOARD_FORMATS:
            raise ValueError(f"unknown board_format {board_format!r}; use one of {BOARD_FORMATS}")
        self.board_format = board_format
        self.min_solution_moves = min_solution_moves
        self.blind_baseline = blind_baseline
        self.goal_board = goal_board
        self.relabel_tiles = relabel_tiles
        self.history = history

    def generate_tasks(self, count: int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
        """`count` puzzles drawn from `seed`: size, an odd shuffle length and the board's own seed.

        With `split` ("train" or "heldout"), every board comes from that pool (`is_heldout`; the task
        says `"split"`): a draw whose board is in the other pool, or closer to solved than
        `min_solution_moves`, is drawn again. Without a split, boards from both pools (the draws of
        earlier versions, unchanged when `min_solution_moves` is 1).
        """
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown sliding puzzle split {split!r}; use one of {SPLITS}")
        rng = random.Random(seed)
        tasks: list[dict[str, Any]] = []
        draws = 0
        while len(tasks) < count:
            draws += 1
            if draws > MAX_DRAWS_PER_TASK * count:
                raise ValueError(
                    f"{draws - 1} draws gave only {len(tasks)} of {count} boards of split {split!r} at least "
                    f"{self.min_solution_moves} moves from solved; allow longer shuffles or a wider size range"
                )
            task = self._draw(rng)
            if self._keeps(task, split):
                tasks.append(task if split is None else {**task, "split": split})
        return tasks

    def _draw(self, rng: random.Random) -> dict[str, Any]:
        size = rng.randint(self.min_size, self.max_size)
        shuffle_moves = rng.randint(1, self.max_shuffle_moves)
        shuffle_moves += 1 - shuffle_moves % 2
        task = {"size": size, "shuffle_moves": shuffle_moves, "puzzle_seed": rng.randrange(2**31)}
        if self.relabel_tiles:
            task["labels"] = random_labels(size, rng)
        return task

    def _keeps(self, task: dict[str, Any], split: str | None) -> bool:
        """Whether a drawn task's board is in `split` (any, for None) and far enough from solved."""
        if split is None and self.min_solution_moves <= 1:
            return True
        grid = task_grid(task)
        if split is not None and is_heldout(grid) != (split == "heldout"):
            return False
        if self.min_solution_moves <= 1:
            return True
        length = solution_length(grid, int(task["shuffle_moves"]))
        return length is not None and length >= self.min_solution_moves

    def reset(self, tasks: list[dict[str, Any]], seeds: list[int]) -> list[EpisodeStart]:
        """One episode per task; a task without "puzzle_seed" uses the episode's seed."""
        starts = []
        for task, seed in zip(tasks, seeds, strict=True):
            size = int(task["size"])
            grid = shuffled_grid(size, int(task["shuffle_moves"]), int(task.get("puzzle_seed", seed)))
            labels = self._labels(task, size)
            metadata = {
                **task,
                "grid": grid,
                "moves": 0,
                "max_moves": min(int(task.get("max_moves", self.max_moves)), self.max_moves),
            }
            if labels is not None:
                metadata["labels"] = labels
            starts.append(
                EpisodeStart(
                    messages=[
                        {
                            "role": "user",
                            "content": instructions(grid, labels, self.goal_board, self.board_format),
                        }
                    ],
                    metadata=metadata,
                    stop_strings=STOP_STRINGS,
                    response_prefix="<action>" if self.action_prefix else "",
                )
            )
        return starts

    def _labels(self, task: dict[str, Any], size: int) -> list[int] | None:
        """The task's tile labels (checked), or None to show the tiles as they are."""
        if task.get("labels") is None:
            return None
        if not self.goal_board:
            raise ValueError(
                "a task with tile labels needs goal_board=true (the goal in words names the tiles 1 to "
                f"{size * size - 1} in order): {task}"
            )
        return check_labels(task["labels"], size)

    def step(self, message_logs: list[list[Message]], metadata: list[dict[str, Any]]) -> EnvStepResult:
        turns = [self._turn(log, meta) for log, meta in zip(message_logs, metadata, strict=True)]
        return EnvStepResult(
            rewards=[t[0] for t in turns],
            observations=[t[1] for t in turns],
            done=[t[2] for t in turns],
            metadata=[t[3] for t in turns],
            info=[t[4] for t in turns],
            stop_strings=[STOP_STRINGS] * len(turns),
            new_context=[not self.history and t[1] is not None for t in turns],
        )

    def _turn(
        self, log: list[Message], meta: dict[str, Any]
    ) -> tuple[float, Message | None, bool, dict[str, Any], dict[str, Any]]:
        """One sample's turn: (reward, observation, done, new metadata, info)."""
        grid: Grid = meta["grid"]
        action = parse_action(last_assistant_content(log))
        moves = meta["moves"] + 1
        show_board = self.redraw_board
        if action is None:
            outcome, text, show_board = (
                "no_action",
                "No action found. Answer with one action like <action>up</action>.",
                True,
            )
        elif action == "view":
            outcome, text, show_board = "view", "Here is the board.", True
        else:
            try:
                moved_from = grid
                grid, text = apply_action(grid, action)
                outcome = "moved"
                if meta.get("labels") is not None:
                    text = _relabel_move_text(text, moved_from, grid, meta["labels"])
            except IllegalMove as e:
                outcome = "illegal"
                text = f"{e} No move made. Legal moves now: {', '.join(legal_directions(grid))}."
        solved = is_solved(grid)
        done = solved or moves >= meta["max_moves"]
        new_meta = {**meta, "grid": grid, "moves": moves}
        info = {"action": action, "outcome": outcome, "solved": solved, "moves": moves}
        if meta["moves"] == 0:
            info.update(self._first_turn_info(meta, grid))
        if solved:
            return 1.0, None, True, new_meta, info
        if done:
            return self.shaped_reward * tiles_in_place(grid), None, True, new_meta, info
        if not self.history:  # the next turn sees the current board alone, as a first turn does
            content = instructions(grid, meta.get("labels"), self.goal_board, self.board_format)
            return 0.0, {"role": "user", "content": content}, False, new_meta, info
        if show_board:
            text += f"\n\n{render_board(grid, meta.get('labels'), self.board_format)}"
        return 0.0, {"role": "user", "content": text}, False, new_meta, info

    def _first_turn_info(self, meta: dict[str, Any], grid: Grid) -> dict[str, Any]:
        """Info of an episode's first turn: whether it moved closer to solved (and the start board and
        budget for the blind baseline)."""
        shuffle = meta.get("shuffle_moves")
        optimal = None if shuffle is None else move_is_optimal(meta["grid"], grid, int(shuffle))
        info: dict[str, Any] = {"first_move_optimal": optimal}
        if self.blind_baseline:
            info.update(start_grid=meta["grid"], max_moves=meta["max_moves"])
        return info

    def batch_metrics(self, results: EnvStepResult) -> dict[str, float]:
        """Per turn: illegal / malformed action rates; over the episodes that ended: solved rate, moves;
        over the episodes that started: the rate of first moves on a shortest solution
        (`env/first_move_optimal_rate`) and, with `blind_baseline`, `env/blind_solved_rate`."""
        n = max(len(results), 1)
        ended = [i for i, d in zip(results.info, results.done, strict=True) if d]
        metrics = {
            "env/illegal_action_rate": sum(i.get("outcome") == "illegal" for i in results.info) / n,
            "env/no_action_rate": sum(i.get("outcome") == "no_action" for i in results.info) / n,
        }
        if ended:
            metrics["env/solved_rate"] = sum(bool(i.get("solved")) for i in ended) / len(ended)
            metrics["env/moves_per_episode"] = sum(i.get("moves", 0) for i in ended) / len(ended)
        firsts = [i for i in results.info if i.get("moves") == 1]
        known = [i["first_move_optimal"] for i in firsts if i.get("first_move_optimal") is not None]
        if known:
            metrics["env/first_move_optimal_rate"] = sum(known) / len(known)
        starts = [i for i in firsts if "start_grid" in i]
        if starts:
            metrics["env/blind_solved_rate"] = blind_solved_rate(
                [i["start_grid"] for i in starts], [i["max_moves"] for i in starts]
            )
        return metrics


def _relabel_move_text(text: str, before: Grid, after: Grid, labels: list[int]) -> str:
    """A move's message ("Moved tile 5 up.", "Slid tile 5 into ...") with the moved tile's label."""
    r, c = next((r, c) for r, row in enumerate(before) for c, v in enumerate(row) if v == 0)
    tile = after[r][c]
    return text.replace(f"tile {tile} ", f"tile {labels[tile - 1]} ", 1)


def oracle_transcript(
    env: SlidingPuzzleEnvironment,
    task: dict[str, Any],
    hide_heldout: bool = True,
    hide_within: int | None = None,
) -> list[Message]:
    """The conversation of an optimal player on `task`, through the environment's own `reset` and `step`:
    its first messages, then per move the assistant turn `<action>{direction}</action>` (what an
    episode's message log holds, with or without `action_prefix`: the prefix plus the generated
    reply) and the environment's observation, until the board is solved (no observation after the
    solving move) or `env.max_moves` runs out.

    With `hide_heldout`, no held-out board (`is_heldout`) is shown: the task must start from a
    training board, and with `redraw_board` the player prefers shortest moves that lead to training
    boards and the conversation stops after a move to a held-out board, before the observation that
    would draw it. SFT on these trains no reply to a board of the held-out pool. With `hide_within`,
    only held-out boards within that many moves of solved are hidden (`hidden_from_training`): a
    transcript through held-out boards far from solved plays on.
    """
    limit = int(task["shuffle_moves"])
    return _play(
        env,
        task,
        hide_heldout,
        hide_within,
        lambda grid, hide_boards: (
            f"<action>{oracle_moves(grid, limit, prefer_train=hide_boards)[0]}</action>"
        ),
    )


def checked_transcript(
    env: SlidingPuzzleEnvironment,
    task: dict[str, Any],
    hide_heldout: bool = True,
    hide_within: int | None = None,
) -> list[Message]:
    """The conversation of the greedy player that writes its check (`written_check`, then
    `<action>{greedy_move}</action>` in the same assistant turn), through the environment's own
    `reset` and `step`, until solved or `env.max_moves` runs out. The environment must not have
    `action_prefix` (the check comes before the action tag). With `hide_heldout`, as in
    `oracle_transcript`: the task starts from a training board and, with `redraw_board`, the
    conversation stops after a move to a held-out board, before the observation that would draw it
    (with `hide_within`, a held-out board within that many moves of solved).
    With `board_format="cells"` each check line names the cell it reads (`written_check(cells=True)`).
    """
    if env.action_prefix:
        raise ValueError(
            "checked transcripts write their check before the action tag: use an environment without "
            "action_prefix (its episodes begin every reply with '<action>')"
        )
    cells = env.board_format == "cells"
    return _play(
        env,
        task,
        hide_heldout,
        hide_within,
        lambda grid, _: f"{written_check(grid, cells=cells)}\n<action>{greedy_move(grid)}</action>",
    )


def turn_contexts(env: SlidingPuzzleEnvironment, messages: list[Message]) -> list[list[Message]]:
    """A transcript (`oracle_transcript`, `checked_transcript`) as what each of its turns saw: the
    whole conversation with history, else (`history=False`: every observation restarts the
    conversation) one [first message for the board, reply] per turn, the token sequences of the
    same GRPO episode."""
    if env.history:
        return [messages]
    return [messages[i : i + 2] for i in range(0, len(messages), 2)]


def _play(
    env: SlidingPuzzleEnvironment,
    task: dict[str, Any],
    hide_heldout: bool,
    hide_within: int | None,
    reply: Callable[[Grid, bool], str],
) -> list[Message]:
    """A player's conversation through the environment's own `reset` and `step`: per turn the
    assistant content `reply(board, hide_boards)` and the observation, until the episode is done or,
    with `hide_heldout` and `redraw_board` (`hide_boards`), right after a move to a board hidden from
    training (`hidden_from_training(board, hide_within)`). With `hide_heldout` the task must not
    start from such a board."""
    [start] = env.reset([task], [0])
    messages, meta = list(start.messages), start.metadata
    if hide_heldout and hidden_from_training(meta["grid"], hide_within):
        raise ValueError(f"task {task} starts from a held-out board")
    hide_boards = hide_heldout and (env.redraw_board or not env.history)  # is every board drawn
    while True:
        messages.append({"role": "assistant", "content": reply(meta["grid"], hide_boards)})
        result = env.step([messages], [meta])
        meta = result.metadata[0]
        if result.done[0] or (hide_boards and hidden_from_training(meta["grid"], hide_within)):
            return messages
        messages.append(result.observations[0])
