"""The Python API from a script or notebook: SFT on in-memory rows, then GRPO with a Python reward
function, with a callback per step. See docs/python_api.md.

    python examples/python_api.py                       # SmolLM2-135M-Instruct, a few steps on CPU
    python examples/python_api.py --model PATH --steps 1 --run-dir /tmp/api   # what CI runs (tiny model)
"""

from __future__ import annotations

import argparse
import random

import posttrain


def arithmetic_rows(n: int, seed: int) -> list[dict]:
    """Tasks with the fields the reward reads: `prompt` and `answer`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append({"prompt": f"What is {a} + {b}? Reply with the number only.", "answer": str(a + b)})
    return rows


def exact_answer(prompts: list, completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """TRL's reward_funcs shape: 1 when the reply is the answer, else 0."""
    return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--run-dir", default="runs/python_api")
    args = parser.parse_args()

    def show(step: int, metrics: dict[str, float]) -> None:
        shown = {k: round(v, 4) for k, v in metrics.items() if k in ("loss", "val/loss", "env/reward_mean")}
        print(f"callback: step {step} {shown}")

    rows = arithmetic_rows(64, seed=0)
    sft_rows = [{"prompt": r["prompt"], "response": r["answer"]} for r in rows]
    sft = posttrain.sft(
        {
            "policy": {"model_name": args.model, "max_seq_len": 64},
            "sft": {"max_steps": args.steps, "global_batch_size": 8, "val_every": args.steps},
            "cluster": {"backend": "local"},
            "logging": {"run_dir": f"{args.run_dir}/sft", "tensorboard": False, "plots": False},
        },
        train_data=sft_rows[:56],
        validation_data=sft_rows[56:],
        callbacks=[show],
    )
    print(f"SFT: {sft.step} steps, last checkpoint {sft.last_checkpoint}")

    config = posttrain.GRPOConfig(
        policy={"model_name": str(sft.last_checkpoint / "model"), "max_seq_len": 96},
        grpo={
            "max_steps": args.steps,
            "prompts_per_step": 2,
            "generations_per_prompt": 4,
            "val_every": args.steps,
        },
        generation={"max_new_tokens": 8},
        data={"system_prompt": None},
        cluster={"backend": "local"},
        logging={"run_dir": f"{args.run_dir}/grpo", "tensorboard": False, "plots": False},
    )
    grpo = posttrain.grpo(
        config,
        train_data=rows[:56],
        validation_data=rows[56:],
        reward_funcs=[exact_answer],
        callbacks=[show],
    )
    print(f"GRPO: {grpo.step} steps, run dir {grpo.run_dir}")


if __name__ == "__main__":
    main()
