"""Evaluation: sample n completions per problem, score them, report pass@k and cons@k.

For problem i with n samples of which c_i are correct (math environment: the last \\boxed{}
answer equals the ground truth by math-verify),

    pass@k = mean_i [1 - C(n - c_i, k) / C(n, k)]          (unbiased; Chen et al. 2021)
    cons@k = mean_i [majority vote over the first k extracted answers is correct]

Answers vote after `vote_key` normalisation ("5.0" and "5" are one vote); ties go to the answer
seen first (see `posttrain.algorithms.metrics.majority_vote`). Writes <output_dir>/summary.json
and <output_dir>/samples.jsonl (one row per completion).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.algorithms.metrics import cons_at_k, pass_at_k
from posttrain.checkpoint.export import resolve_model_source
from posttrain.config.schema import EvalConfig
from posttrain.data.math import Problem, build_math_problems
from posttrain.environments.group import EnvironmentGroup
from posttrain.models.generation import SamplingParams
from posttrain.models.text_generation import Completion, generate_texts
from posttrain.models.tokenizer import load_tokenizer
from posttrain.trainers.common import prepare_run_dir, seed_everything


@dataclass
class SampleRecord:
    problem_index: int
    sample_index: int
    prompt: str
    completion: str
    answer: str
    extracted_answer: str | None
    correct: bool
    truncated: bool
    num_tokens: int


@dataclass
class EvalResult:
    output_dir: Path
    summary: dict[str, Any]
    samples: list[SampleRecord]


_DECORATION = re.compile(r"\\[,;!$% ]|\\text\{([^{}]*)\}|[\s$]")


def vote_key(answer: str | None) -> str | None:
    """The form an answer votes under: spacing, `$` and a trailing period dropped; numbers canonical.

    "5", " 5.0 ", "$5$" and "05" all vote as "5"; "1,000" as "1000"; non-numbers keep their text.
    """
    if answer is None:
        return None
    text = _DECORATION.sub(lambda m: m.group(1) or "", answer).rstrip(".")
    if not text:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def summarize(correct: list[list[bool]], answers: list[list[str | None]], ks: list[int]) -> dict[str, float]:
    """pass@k and cons@k averaged over problems; row i holds problem i's n samples, in sample order."""
    if not correct:
        raise ValueError("no problems to summarize")
    n = len(correct[0])
    if any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same number of samples")
    out: dict[str, float] = {"accuracy": sum(map(sum, correct)) / (n * len(correct))}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(row), k) for row in correct) / len(correct)
        out[f"cons@{k}"] = sum(
            cons_at_k([vote_key(a) for a in ans], ok, k) for ans, ok in zip(answers, correct, strict=True)
        ) / len(correct)
    return out


def sampling_params(cfg: EvalConfig) -> SamplingParams:
    g = cfg.generation
    return SamplingParams(
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_new_tokens=g.max_new_tokens,
        stop_strings=tuple(g.stop_strings),
        seed=cfg.sampling.seed,
    )


def score(
    problems: list[Problem], completions: list[Completion], n: int, cfg: EvalConfig
) -> list[SampleRecord]:
    """Run the environment on every (problem, completion) pair; completions are grouped n per problem."""
    messages = [
        [*problems[i // n].messages, {"role": "assistant", "content": c.text}]
        for i, c in enumerate(completions)
    ]
    metadata = [{"answer": problems[i // n].answer} for i in range(len(completions))]
    with EnvironmentGroup(cfg.environment.name, cfg.environment.kwargs, backend="local") as env:
        result = env.step(messages, metadata)
    records = []
    for i, (c, info) in enumerate(zip(completions, result.info, strict=True)):
        p = problems[i // n]
        records.append(
            SampleRecord(
                problem_index=i // n,
                sample_index=i % n,
                prompt=p.messages[-1]["content"],
                completion=c.text,
                answer=p.answer,
                extracted_answer=info.get("extracted_answer"),
                correct=bool(info.get("correct", False)),
                truncated=c.truncated,
                num_tokens=len(c.token_ids),
            )
        )
    return records


def write_outputs(out_dir: Path, summary: dict[str, Any], records: list[SampleRecord]) -> None:
    with open(out_dir / "samples.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def run_eval(cfg: EvalConfig) -> EvalResult:
    out_dir = prepare_run_dir(cfg.output_dir, "eval", cfg)
    seed_everything(cfg.sampling.seed)
    source = resolve_model_source(cfg.model, cfg.tokenizer_name)
    tokenizer = load_tokenizer(source.tokenizer)
    problems = build_math_problems(
        cfg.data.dataset,
        tokenizer,
        prompt_template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
        max_prompt_len=cfg.data.max_prompt_len,
    )
    n = cfg.sampling.samples_per_prompt
    start = time.perf_counter()
    completions = generate_texts(
        source.model,
        tokenizer,
        [p.prompt_ids for p in problems for _ in range(n)],
        sampling_params(cfg),
        backend=cfg.generation.backend,
        batch_size=cfg.generation.batch_size,
        dtype=cfg.dtype,
        device=cfg.device,
        vllm=cfg.generation.vllm,
    )
    generation_s = time.perf_counter() - start
    records = score(problems, completions, n, cfg)
    correct = [[r.correct for r in records[i * n : (i + 1) * n]] for i in range(len(problems))]
    answers = [[r.extracted_answer for r in records[i * n : (i + 1) * n]] for i in range(len(problems))]
    tokens = sum(r.num_tokens for r in records)
    summary: dict[str, Any] = {
        "model": cfg.model,
        "checkpoint": str(source.checkpoint) if source.checkpoint else None,
        "num_problems": len(problems),
        "samples_per_prompt": n,
        "temperature": cfg.generation.temperature,
        "top_p": cfg.generation.top_p,
        **summarize(correct, answers, cfg.sampling.k),
        "boxed_rate": sum(r.extracted_answer is not None for r in records) / len(records),
        "truncation_rate": sum(r.truncated for r in records) / len(records),
        "mean_completion_tokens": tokens / len(records),
        "generation_s": generation_s,
        "generated_tokens_per_s": tokens / max(generation_s, 1e-9),
    }
    write_outputs(out_dir, summary, records)
    return EvalResult(out_dir, summary, records)
