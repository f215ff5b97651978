"""Reference transcripts of the HumanEval-shaped code tasks, for an SFT warm start
(docs/environments.md#code-on-humaneval-shaped-tasks).

Writes one JSON line per task, `{"messages": [...], "task": {...}}`: the task's prompt (HumanEval's
wording, `code_docstring.HUMANEVAL_PROMPT`) and the assistant turn that answers with the template's
reference solution in a ```python block (the prompt's imports and `def` line, then the body), a reply
the code environment pays 1. Training transcripts come from the "train" templates only (no held-out
template is shown); `--split heldout` writes a validation set for the SFT loss. `posttrain sft` reads
the files as `data.train.path` and `data.validation.path`:

    python examples/code_transcripts.py data/code_docstring_sft.jsonl --count 2000 --seed 11
    python examples/code_transcripts.py data/code_docstring_sft_heldout.jsonl --count 64 --seed 99999 --split heldout
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posttrain.environments.code_docstring import generate_docstring_solutions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=2000, help="tasks (one transcript each)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the draw")
    parser.add_argument("--split", choices=["train", "heldout"], default="train", help="the templates' split")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for task, solution in generate_docstring_solutions(args.count, args.seed, args.split):
            reply = {"role": "assistant", "content": f"```python\n{solution}```"}
            f.write(json.dumps({"messages": [*task["messages"], reply], "task": task}) + "\n")
    print(f"wrote {args.count} transcripts of {args.split} templates to {args.out}")


if __name__ == "__main__":
    main()
