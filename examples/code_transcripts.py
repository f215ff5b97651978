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

from posttrain.data.transcripts import transcripts_parser, write_transcripts
from posttrain.environments.code_docstring import generate_docstring_solutions


def main(argv: list[str] | None = None) -> None:
    args = transcripts_parser(__doc__, count=2000, seed=11, pool="templates").parse_args(argv)
    rows = (
        ([*task["messages"], {"role": "assistant", "content": f"```python\n{solution}```"}], task)
        for task, solution in generate_docstring_solutions(args.count, args.seed, args.split)
    )
    written = write_transcripts(args.out, rows)
    print(f"wrote {written} transcripts of {args.split} templates to {args.out}")


if __name__ == "__main__":
    main()
