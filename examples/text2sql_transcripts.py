"""Gold transcripts of Text2SQL, for an SFT warm start (docs/environments.md#text2sql).

Writes one JSON line per task, `{"messages": [...], "task": {...}}`: the environment's own first
messages (as `reset` makes them, with the recipe's environment arguments) and the assistant turn that
answers with the task's gold query in a ```sql block, the reply the environment pays 1. Training
transcripts come from the training split only (no held-out question is shown); `--split heldout`
writes a validation set for the SFT loss. `posttrain sft` reads the files as `data.train.path` and
`data.validation.path`:

    python examples/text2sql_transcripts.py data/text2sql_sft.jsonl --count 1000 --seed 11
    python examples/text2sql_transcripts.py data/text2sql_sft_heldout.jsonl --count 64 --seed 99999 --split heldout
"""

from __future__ import annotations

import json

from posttrain.data.transcripts import transcripts_parser, write_transcripts
from posttrain.environments.text2sql import Text2SQLEnvironment, gold_transcript


def main(argv: list[str] | None = None) -> None:
    parser = transcripts_parser(__doc__, count=1000, seed=11, pool="questions")
    parser.add_argument("--env", default="{}", help="Text2SQLEnvironment keyword arguments, as JSON")
    args = parser.parse_args(argv)
    env = Text2SQLEnvironment(**json.loads(args.env))
    tasks = env.generate_tasks(args.count, args.seed, split=args.split)
    written = write_transcripts(args.out, ((gold_transcript(env, task), task) for task in tasks))
    env.close()
    print(f"wrote {written} transcripts of {args.split} questions to {args.out}")


if __name__ == "__main__":
    main()
