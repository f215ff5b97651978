"""Calculator tool-call transcripts, for an SFT warm start (docs/environments.md#calculator-without-a-worked-example).

Writes one JSON line per task, `{"messages": [...], "task": {...}}`: the environment's own system
prompt (the tool described in it) and question, an assistant turn that calls
`calculator("a op b")`, the environment's `tool` message with the result, and the final
`The answer is \\boxed{result}.` (`posttrain.environments.calculator.oracle_transcript`, which
checks that the environment scores it 1). `posttrain sft` reads the files as `data.train.path` and
`data.validation.path`:

    ENV='{"tools_in_system_prompt": true, "answer_format": "boxed"}'
    python examples/calculator_transcripts.py data/calculator_sft.jsonl --count 2000 --env "$ENV"
    python examples/calculator_transcripts.py data/calculator_sft_val.jsonl --count 64 --seed 99999 \\
        --split heldout --env "$ENV"

Tasks come from the training pool by default (`--split heldout`: the pool the GRPO recipe validates
on; the pools share no operands, `posttrain.environments.calculator.task_split`). `--env` takes
the environment's keyword arguments: give the GRPO recipe's (the transcripts must be
the episodes' format) and the family to learn from (`operation`, `digits`, `phrasings`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posttrain.environments.calculator import CalculatorEnvironment, oracle_transcript


def write_transcripts(
    out: Path, env: CalculatorEnvironment, count: int, seed: int, split: str | None = "train"
) -> int:
    """Write the transcripts of `count` tasks of `split` drawn from `seed`; returns the number written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = env.generate_tasks(count, seed, split=split)
    with open(out, "w") as f:
        for task in tasks:
            f.write(json.dumps({"messages": oracle_transcript(env, task), "task": task}) + "\n")
    return len(tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=2000, help="tasks (one transcript each)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the draw")
    parser.add_argument("--split", choices=["train", "heldout"], default="train", help="the pool of tasks")
    parser.add_argument("--env", default="{}", help="CalculatorEnvironment keyword arguments, as JSON")
    args = parser.parse_args(argv)
    env = CalculatorEnvironment(**json.loads(args.env))
    written = write_transcripts(args.out, env, args.count, args.seed, args.split)
    print(f"wrote {written} transcripts to {args.out}")


if __name__ == "__main__":
    main()
