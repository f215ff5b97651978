"""Evaluation: run n episodes per task (one turn or several), score them, report pass@k and cons@k.

For problem i with n samples of which c_i are correct (math environment: the last \\boxed{}
answer equals the ground truth by math-verify),

    pass@k = mean_i [1 - C(n - c_i, k) / C(n, k)]          (unbiased; Chen et al. 2021)
    cons@k = mean_i [majority vote over the first k extracted answers is correct]

Answers vote after `vote_key` normalisation ("5.0" and "5" are one vote); ties go to the answer
seen first (see `posttrain.algorithms.metrics.majority_vote`). An episode is correct when the
environment says so (`info["correct"]`), else when its reward is at least 1 (a solved puzzle).
The metric is whatever the environment rewards: any environment's episodes give mean_reward
(and accuracy, pass@k, cons@k from its verdicts), math is only the default.
Episodes run through the same rollout code as training (`run_rollouts`), so multi-turn
environments and tools work here too. `metric: loss` instead reads the dataset as SFT rows and
reports their held-out loss and perplexity (`run_loss_eval`), generating nothing. Writes <output_dir>/summary.json and
<output_dir>/samples.jsonl (one row per episode, with the whole conversation when it had several
turns).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.algorithms.metrics import cons_at_k, pass_at_k
from posttrain.checkpoint.export import ModelSource, resolve_model_source, weights_dtype
from posttrain.config.common import config_warning
from posttrain.config.eval import EvalConfig
from posttrain.config.rollout import episode_token_budget
from posttrain.data.tokenize import TokenizedExample
from posttrain.environments.group import EnvironmentGroup
from posttrain.environments.interface import VerifierErrorsError, check_verifier_errors
from posttrain.generation.text_generation import LocalGenerator
from posttrain.logging.timer import Timer
from posttrain.modeling.tokenizer import load_tokenizer, require_chat_template
from posttrain.rollout.rollout import Rollouts, run_rollouts, transcript
from posttrain.rollout.tasks import load_tasks
from posttrain.trainers.common import prepare_run_dir, sampling_params, seed_everything


@dataclass
class SampleRecord:
    """One episode: its prompt, the last reply, the verdict; for several turns the whole conversation."""

    problem_index: int
    sample_index: int
    prompt: str
    completion: str
    answer: str | None
    extracted_answer: str | None
    correct: bool
    truncated: bool
    num_tokens: int
    reward: float = 0.0
    turns: int = 1
    messages: list[dict] | None = None
    verifier_error: str | None = None


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


def model_max_len(model_dir: str, max_seq_len: int) -> int:
    """`max_seq_len`, capped at the model's own position limit (`max_position_embeddings`)."""
    from transformers import AutoConfig

    limit = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    return min(max_seq_len, limit) if limit else max_seq_len


def sample_records(rollouts: Rollouts, n: int) -> list[SampleRecord]:
    """One record per episode; episodes come n per task, in task order."""
    records = []
    for i, t in enumerate(rollouts.trajectories):
        row = transcript(t)
        records.append(
            SampleRecord(
                problem_index=i // n,
                sample_index=i % n,
                prompt=row["prompt"],
                completion=row["completion"],
                answer=None if row["answer"] is None else str(row["answer"]),
                extracted_answer=t.info.get("extracted_answer"),
                correct=bool(t.info.get("correct", t.reward >= 1.0)),
                truncated=t.truncated,
                num_tokens=t.response_length,
                reward=t.reward,
                turns=t.num_turns,
                messages=row.get("messages"),
                verifier_error=t.info.get("verifier_error"),
            )
        )
    return records


def write_outputs(out_dir: Path, summary: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """samples.jsonl (one row per sample) and summary.json."""
    with open(out_dir / "samples.jsonl", "w") as f:
        for row in samples:
            f.write(json.dumps(row) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def eval_dtype(requested: str, source: ModelSource) -> str:
    """`weights_dtype` of the evaluated model; warns when float32 is asked of a checkpoint whose run
    computed in bfloat16 (its fp32 master weights are not the function it trained)."""
    if requested == "float32" and weights_dtype("auto", source.model) == "bfloat16":
        config_warning(
            f"dtype=float32 evaluates the fp32 master weights of {source.checkpoint}, whose run trained and "
            "sampled in bfloat16; updates below bf16's rounding step moved them without moving the "
            "policy it validated (dtype=auto evaluates that policy)"
        )
    return weights_dtype(requested, source.model)


def run_eval(cfg: EvalConfig) -> EvalResult:
    source = resolve_model_source(cfg.model, cfg.tokenizer_name)  # a missing model: no output dir
    out_dir = prepare_run_dir(cfg.output_dir, "eval", cfg)
    seed_everything(cfg.sampling.seed)
    tokenizer = load_tokenizer(source.tokenizer, cfg.chat_template)
    require_chat_template(tokenizer, source.tokenizer, cfg.chat_template, "chat_template")
    dtype = eval_dtype(cfg.dtype, source)
    if cfg.metric == "loss":
        return run_loss_eval(cfg, source.model, dtype, tokenizer, out_dir)
    env_cfg = cfg.environment
    tasks = load_tasks(
        cfg.data.dataset,
        env_cfg,
        prompt_template=cfg.data.prompt_template,
        system_prompt=cfg.data.system_prompt,
        example_turns=cfg.data.example_turns,
        tokenizer=tokenizer,
        max_prompt_len=cfg.data.max_prompt_len,
    )
    max_seq_len = model_max_len(source.model, cfg.max_seq_len)
    with EnvironmentGroup(env_cfg.name, env_cfg.kwargs, backend="local") as env:
        n = cfg.sampling.samples_per_prompt
        params = sampling_params(cfg.generation, cfg.sampling.seed, environment=env_cfg)
        generator = LocalGenerator(
            source.model,
            tokenizer,
            backend=cfg.generation.backend,
            dtype=dtype,
            device=cfg.device,
            vllm=cfg.generation.vllm,
            max_model_len=max_seq_len,
            seed=params.seed or 0,
        )
        timer = Timer()
        rollouts = run_rollouts(
            tasks,
            generations_per_prompt=n,
            generator=generator,
            environment=env,
            tokenizer=tokenizer,
            params=params,
            batch_size=cfg.generation.batch_size,
            max_turns=env_cfg.max_turns,
            max_seq_len=max_seq_len,
            max_observation_tokens=env_cfg.max_observation_tokens,
            max_episode_tokens=episode_token_budget(cfg.generation, env_cfg),
            timer=timer,
            turn_barrier=env_cfg.turn_barrier,
            progress="evaluation",
        )
    generation_s = timer.pop().get("timing/generation", 0.0)
    records = sample_records(rollouts, n)
    correct = [[r.correct for r in records[i * n : (i + 1) * n]] for i in range(len(tasks))]
    answers = [[r.extracted_answer for r in records[i * n : (i + 1) * n]] for i in range(len(tasks))]
    tokens = sum(r.num_tokens for r in records)
    summary: dict[str, Any] = {
        "model": cfg.model,
        "checkpoint": str(source.checkpoint) if source.checkpoint else None,
        "dtype": dtype,
        "num_problems": len(tasks),
        "samples_per_prompt": n,
        "temperature": cfg.generation.temperature,
        "top_p": cfg.generation.top_p,
        **summarize(correct, answers, cfg.sampling.k),
        # replies with an answer the environment could read: a boxed one (math), a code block (code), ...
        "answer_rate": sum(r.extracted_answer is not None for r in records) / len(records),
        "truncation_rate": sum(r.truncated for r in records) / len(records),
        "mean_reward": sum(r.reward for r in records) / len(records),
        "mean_turns": sum(r.turns for r in records) / len(records),
        # episodes the environment could not score (a reward function that raised, a verifier timeout)
        "verifier_error_rate": sum(r.verifier_error is not None for r in records) / len(records),
        "mean_completion_tokens": tokens / len(records),
        "generation_s": generation_s,
        "generated_tokens_per_s": tokens / max(generation_s, 1e-9),
        **{k: v for k, v in rollouts.env_metrics.items() if k.startswith(("env/", "episode/"))},
    }
    write_outputs(out_dir, summary, [asdict(r) for r in records])
    try:  # after writing: the samples show each error
        check_verifier_errors(
            [t.info for t in rollouts.trajectories], env_cfg.max_error_fraction, env_cfg.name
        )
    except VerifierErrorsError as e:
        raise VerifierErrorsError(
            f"{e}. The accuracy would count them as wrong; samples: {out_dir}"
        ) from None
    return EvalResult(out_dir, summary, records)


def heldout_nll(model: Any, examples: list[TokenizedExample], batch_size: int) -> list[tuple[float, int]]:
    """Per sequence: (sum over its assistant tokens of -log p(token | prefix), number of those tokens),
    the targets of `posttrain sft` (loss_mask), in fp32 log-probabilities."""
    from posttrain.data.batching import collate
    from posttrain.models.logprobs import batched_logprobs

    out = []
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start : start + batch_size])
        lp = batched_logprobs(model, batch, "loss_mask", batch_size=batch_size, chunk_size=2048)
        nll = -(lp.double() * batch.loss_mask.double()).sum(dim=1)
        counts = batch.loss_mask.sum(dim=1)
        out += [(float(n), int(c)) for n, c in zip(nll, counts, strict=True)]
    return out


def run_loss_eval(cfg: EvalConfig, model_dir: str, dtype: str, tokenizer: Any, out_dir: Path) -> EvalResult:
    """metric=loss: the held-out loss of SFT rows. loss = sum of NLL over every assistant token of the
    set / their count (one token mean, as `posttrain sft`'s val/loss); perplexity = exp(loss).
    Writes summary.json and samples.jsonl (one row per sequence: its NLL sum and token count)."""
    import math

    import torch

    from posttrain.data.sft import build_sft_dataset
    from posttrain.modeling.loading import DTYPES, load_causal_lm

    data = build_sft_dataset(cfg.data.dataset, tokenizer, max_seq_len=cfg.max_seq_len)
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    model = load_causal_lm(model_dir, DTYPES[dtype]).to(device)
    rows = heldout_nll(model, data.examples, cfg.generation.batch_size)
    tokens = sum(c for _, c in rows)
    loss = sum(n for n, _ in rows) / tokens
    summary: dict[str, Any] = {
        "model": cfg.model,
        "metric": "loss",
        "dtype": dtype,
        "loss": loss,
        "perplexity": math.exp(loss),
        "num_sequences": len(rows),
        "num_target_tokens": tokens,
        "num_truncated": data.num_truncated,
        "num_dropped": data.num_dropped,
    }
    samples = [{"index": i, "nll_sum": nll, "target_tokens": count} for i, (nll, count) in enumerate(rows)]
    write_outputs(out_dir, summary, samples)
    return EvalResult(out_dir, summary, [])
