"""Calculator tool-call transcripts, for an SFT warm start (docs/environments.md#calculator-without-a-worked-example).

Writes one JSON line per task, `{"messages": [...], "task": {...}}`: the environment's own system
prompt (the tool described in it) and question, an assistant turn that calls
`calculator("a op b")`, the environment's `tool` message with the result, and the final
`The answer is \\boxed{result}.` (`posttrain.environments.calculator.oracle_transcript`, which
checks that the environment scores it 1). `posttrain sft` reads the files as `data.train.path` and
`data.validation.path`:

    PRODUCTS='{"tools_in_system_prompt": true, "answer_format": "boxed", "phrasings": ["what_is", "rows"]}'
    SUMS='{"tools_in_system_prompt": true, "answer_format": "boxed", "operation": "+", "phrasings": ["what_is", "total", "more"]}'
    python examples/calculator_transcripts.py data/calculator_sft.jsonl --count 2000 \\
        --env "$PRODUCTS" --env "$SUMS"
    python examples/calculator_transcripts.py data/calculator_sft_val.jsonl --count 64 --seed 99999 \\
        --split heldout --env "$PRODUCTS" --env "$SUMS"

Tasks come from the training pool by default (`--split heldout`: the pool the GRPO recipe validates
on; the pools share no operands, `posttrain.environments.calculator.task_split`). `--env` takes
the environment's keyword arguments: give the GRPO recipe's (the transcripts must be
the episodes' format) and the family to learn from (`operation`, `digits`, `phrasings`); several
`--env` share the count out among their families (the i-th drawn from seed + i), rows interleaved.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from posttrain.data.transcripts import transcripts_parser
from posttrain.data.transcripts import write_transcripts as write_rows
from posttrain.environments.calculator import CalculatorEnvironment, oracle_transcript


def write_transcripts(
    out: Path, envs: list[CalculatorEnvironment], count: int, seed: int, split: str | None = "train"
) -> int:
    """Write the transcripts of `count` tasks of `split` drawn from `seed`, shared out among `envs`
    (task families: one operation each, say) and interleaved, so that every batch mixes them;
    returns the number written."""
    shares = [count // len(envs) + (i < count % len(envs)) for i in range(len(envs))]
    per_env = [
        [(env, t) for t in env.generate_tasks(n, seed + i, split=split)]  # family i draws from seed + i
        for i, (env, n) in enumerate(zip(envs, shares, strict=True))
    ]
    rows = [row for group in itertools.zip_longest(*per_env) for row in group if row is not None]
    return write_rows(out, ((oracle_transcript(env, task), task) for env, task in rows))


def main(argv: list[str] | None = None) -> None:
    parser = transcripts_parser(__doc__, count=2000, seed=11, pool="tasks")
    parser.add_argument(
        "--env",
        action="append",
        help="CalculatorEnvironment keyword arguments, as JSON; repeat it for several task families "
        "(the count is shared out among them, the rows interleaved)",
    )
    args = parser.parse_args(argv)
    envs = [CalculatorEnvironment(**json.loads(kwargs)) for kwargs in args.env or ["{}"]]
    written = write_transcripts(args.out, envs, args.count, args.seed, args.split)
    print(f"wrote {written} transcripts to {args.out}")


if __name__ == "__main__":
    main()
