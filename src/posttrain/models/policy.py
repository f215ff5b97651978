"""The training policy: one data-parallel rank of a Hugging Face causal LM with its optimizer.

A `Policy` runs inside a worker (a Ray actor, or the controller process in local mode). Each
optimizer step sums microbatch losses that the caller normalised by GLOBAL counts, adds the
gradients of all data-parallel ranks (all-reduce SUM), clips the global norm, and steps AdamW.

Precision: the parameters (master weights), their gradients and AdamW's state are always fp32.
`policy.dtype` is the COMPUTE dtype: with bfloat16, forward and backward passes run in bf16 (FSDP2:
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`; otherwise `torch.autocast` around
every forward: training, logprobs, the reference model and colocated HF generation). bf16 master
weights would lose small updates: at lr 1e-6 an update is below half a bf16 ulp of almost every
weight, which then never changes. Checkpoints hold the fp32 master weights (resuming is exact);
`posttrain export` writes the checkpoint in the dtype the run computed in unless told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from posttrain.algorithms.metrics import accumulate_metrics
from posttrain.config.common import PolicyConfig
from posttrain.data.batching import TokenBatch
from posttrain.modeling.attention import enable_activation_checkpointing
from posttrain.modeling.loading import (
    DTYPES,
    MASTER_DTYPE,
    CheckpointMismatchError,
    compute_autocast,
    load_causal_lm,
    pick_device,
    set_torch_threads,
)
from posttrain.models.logprobs import batched_logprobs, token_logprobs
from posttrain.models.optim import build_optimizer
from posttrain.weights.refit import weights_checksum

LossFn = Callable[[torch.Tensor, TokenBatch, float], tuple[torch.Tensor, dict[str, float]]]
"""(token_logprobs [B, T] (`Policy.loss_inputs`; a reward model gives scores [B]), microbatch, global
normalizer) -> (loss, metrics summed over microbatches)."""


@dataclass
class TrainResult:
    """One optimizer step on one rank. `loss_metrics` are this rank's share of global means."""

    loss_metrics: dict[str, float] = field(default_factory=dict)
    grad_norm: float = 0.0
    lr: float = 0.0
    num_tokens: int = 0


def compile_decoder_layers(model: torch.nn.Module) -> None:
    """torch.compile every decoder layer in place (parameter names unchanged).

    The layers share one code object, so they share one compiled graph: compilation costs about
    what one layer costs, not the model. The embedding, the final norm and the lm_head/log-softmax
    (`LinearLogprobs`, already lean) stay eager.
    """
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise RuntimeError(
            f"policy.compile=true: cannot find decoder layers (base_model.layers) on {type(model).__name__}; "
            "set policy.compile=false"
        )
    for layer in layers:
        layer.compile()


class Policy:
    """One rank of the trained model. Methods are called by `PolicyGroup` on every rank."""

    def __init__(
        self,
        cfg: PolicyConfig,
        *,
        model_path: str,
        total_steps: int,
        rank: int = 0,
        world_size: int = 1,
        gpus: int = 0,
        num_threads: int | None = None,
    ) -> None:
        set_torch_threads(num_threads)
        self.cfg, self.rank, self.world_size, self.total_steps = cfg, rank, world_size, total_steps
        self.device = pick_device(gpus)
        self.compute_dtype = DTYPES[cfg.dtype]
        self.model_path = model_path
        torch.manual_seed(cfg.seed)  # also the LoRA initialisation: the same on every rank
        self.model = self.load_model(model_path)
        if cfg.lora is not None:
            from posttrain.models.lora import apply_lora

            apply_lora(self.model, cfg.lora, base_model=model_path, **self.lora_options())
        self.model = self.model.to(self.device)
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.model.config.use_cache = False
        if cfg.compile:
            compile_decoder_layers(self.model)
        self.loss_scale = 1.0  # FSDP averages gradients over ranks; it sets this to world_size
        self.optimizer, self.scheduler = build_optimizer(
            [p for p in self.model.parameters() if p.requires_grad], cfg.optimizer, cfg.scheduler, total_steps
        )

    def load_model(self, model_path: str) -> torch.nn.Module:
        """The trained module, in fp32 (master weights); subclasses load other heads (e.g. a reward model)."""
        return load_causal_lm(model_path, MASTER_DTYPE)

    def lora_options(self) -> dict[str, Any]:
        """peft options of `apply_lora` for this kind of model (a reward model trains its new head too)."""
        return {}

    @property
    def lora(self) -> bool:
        return self.cfg.lora is not None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context of every forward pass: autocast to `policy.dtype`, except under FSDP2, whose
        mixed-precision policy casts the parameters itself."""
        if self.sharded:
            return contextlib.nullcontext()
        return compute_autocast(self.device, self.compute_dtype)

    def loss_inputs(self, micro: TokenBatch) -> torch.Tensor:
        """What `train` hands the loss function: [B, T] token log-probabilities on `loss_mask`."""
        return token_logprobs(
            self.model,
            micro.input_ids,
            micro.attention_mask,
            micro.loss_mask,
            chunk_size=self.cfg.logprob_chunk_size,
            temperature=self.cfg.logprob_temperature,
            packed=self.cfg.packed_sequences,
        )

    # ------------------------------------------------------------------ distributed
    def rendezvous_address(self) -> tuple[str, int]:
        """Called on rank 0: an address and free port for torch.distributed."""
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_distributed(self, address: str, port: int) -> None:
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://{address}:{port}", rank=self.rank, world_size=self.world_size
        )
        if self.cfg.fsdp:
            from posttrain.modeling.fsdp import shard_model

            shard_model(self.model, dtype=self.compute_dtype)
            self.loss_scale = float(self.world_size)
            self.optimizer, self.scheduler = build_optimizer(
                [p for p in self.model.parameters() if p.requires_grad],
                self.cfg.optimizer,
                self.cfg.scheduler,
                self.total_steps,
            )

    # ------------------------------------------------------------------ compute
    def _to_device(self, batch: TokenBatch) -> TokenBatch:
        return type(batch)(
            **{k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in vars(batch).items()}
        )

    def train(self, batch: TokenBatch, loss_fn: LossFn, normalizer: float) -> TrainResult:
        """One optimizer step on this rank's shard; `normalizer` counts the whole global batch."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        micros = list(batch.microbatches(self.cfg.train_micro_batch_size))
        if self.sharded:  # before any forward: the count is agreed by a collective
            self._join_missing_microbatches(len(micros))
        for micro in micros:
            micro = self._to_device(micro)
            with self.autocast():
                inputs = self.loss_inputs(micro)
            loss, micro_metrics = loss_fn(inputs, micro, normalizer)
            (loss * self.loss_scale).backward()
            accumulate_metrics(metrics, micro_metrics)  # shares add up; *_min / *_max by min / max
        if self.world_size > 1 and not self.cfg.fsdp:
            self._all_reduce_gradients()
        max_norm = self.cfg.optimizer.max_grad_norm or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        return TrainResult(metrics, float(grad_norm), lr, batch.num_tokens)

    def _join_missing_microbatches(self, done: int) -> None:
        """FSDP2: every forward and backward is a collective, so a rank with fewer microbatches than
        another (uneven shards) runs the difference on a dummy row with a zero loss (first, right after
        the ranks agree on the count: every rank then runs the same sequence of collectives)."""
        from posttrain.modeling.fsdp import all_ranks_max, collective_group

        group = collective_group(self.model)
        if group is None:
            return
        for _ in range(all_ranks_max(done, group, self.device) - done):
            ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
            dummy = TokenBatch(ids, torch.ones_like(ids), torch.zeros((1, 2), device=self.device))
            (self.loss_inputs(dummy).sum() * 0.0).backward()

    def _all_reduce_gradients(self) -> None:
        """Sum gradients over ranks, one flat buffer per dtype."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, target_mask: str = "loss_mask") -> torch.Tensor:
        """[B, T] log-probabilities of the tokens where `batch.<target_mask>` is set (0 elsewhere), on CPU."""
        self.model.eval()
        with self.autocast():
            return batched_logprobs(
                self.model,
                batch,
                target_mask,
                batch_size=self.cfg.logprob_batch_size,
                chunk_size=self.cfg.logprob_chunk_size,
                temperature=self.cfg.logprob_temperature,
                packed=self.cfg.packed_sequences,
            )

    # ------------------------------------------------------------------ state
    def parameters_checksum(self, dtype: str | None = None) -> tuple[float, float]:
        """(Σw, Σw²) in fp64, of the weights cast to `dtype` if given: a cheap fingerprint for tests and refit checks.

        Under FSDP2 (a collective) every rank sums its own shard and the sums are added over ranks."""
        cast = DTYPES[dtype] if dtype else None
        if self.lora:  # what a generator runs: the merged weights (under FSDP2 gathered on every rank)
            sums = [weights_checksum([t], cast) for _, t in self.generator_weights()]  # each a new tensor
            return sum(s for s, _ in sums), sum(q for _, q in sums)
        if not self.sharded:
            return weights_checksum(self.model.parameters(), cast)
        local = weights_checksum([p.to_local() for p in self.model.parameters()], cast)
        sums = torch.tensor(local, dtype=torch.float64, device=self.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        return float(sums[0]), float(sums[1])

    def generator_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every weight a generator runs, named as in the base model: the
        parameters, or with LoRA the merged `W + s·B@A` (new tensors, the trained ones untouched).
        Under FSDP2 each tensor is gathered (a collective: every rank iterates in step)."""
        if self.lora:
            from posttrain.models.lora import merged_weights

            return merged_weights(self.model, full_tensor)
        return ((name, full_tensor(p)) for name, p in self.model.named_parameters())

    def generator_weight_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """(name, full shape, dtype) of what `generator_weights` yields, in its order."""
        if self.lora:
            from posttrain.models.lora import merged_specs

            return merged_specs(self.model)
        return [(name, tuple(p.shape), p.dtype) for name, p in self.model.named_parameters()]

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        """Full tensors on CPU (under FSDP2 a collective: every rank must call it)."""
        if self.sharded:
            from posttrain.modeling.fsdp import full_model_state

            return full_model_state(self.model)
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    @property
    def sharded(self) -> bool:
        return self.cfg.fsdp and dist.is_initialized()

    def save_checkpoint(self, directory: str) -> None:
        """Rank 0 writes the model as an HF folder of FULL weights (format.json says so), the optimizer and
        scheduler; every rank its RNG state. With FSDP2 every rank joins the gather of the full weights
        and writes its own optimizer shard (optimizer_rank<r>.pt). With LoRA `model/` is a peft adapter
        folder (the trained tensors only; format.json: lora_adapter and the base model's path)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)  # every rank writes into it, whichever comes first
        if self.lora:
            self._save_adapter(path)
        else:
            self._save_full_model(path)
        if self.sharded:
            from posttrain.modeling.fsdp import optimizer_shard_state

            state = {"optimizer": optimizer_shard_state(self.model, self.optimizer)}
            torch.save(
                {**state, "scheduler": self.scheduler.state_dict()}, path / f"optimizer_rank{self.rank}.pt"
            )
        elif self.rank == 0:
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                path / "optimizer.pt",
            )
        torch.save(_rng_state(), path / f"rng_rank{self.rank}.pt")

    def _save_full_model(self, path: Path) -> None:
        full_state = None
        if self.sharded:
            from posttrain.modeling.fsdp import full_model_state

            full_state = full_model_state(self.model)  # a collective: every rank calls it
        if self.rank == 0:
            self.model.save_pretrained(path / "model", state_dict=full_state, safe_serialization=True)
            self._write_format(path, {"model": "hf_full_state"})

    def _save_adapter(self, path: Path) -> None:
        from posttrain.models.lora import adapter_state, save_adapter

        state = adapter_state(self.model, full_tensor)  # under FSDP2 a collective: every rank
        if self.rank == 0:
            save_adapter(self.model, state, path / "model")
            self._write_format(path, {"model": "lora_adapter", "base_model": self.model_path})

    def _write_format(self, path: Path, fmt: dict[str, Any]) -> None:
        layout = "per_rank" if self.sharded else "rank0"
        fmt = {**fmt, "optimizer": layout, "world_size": self.world_size}
        # the weights are the fp32 master weights; `posttrain export` casts them to compute_dtype
        fmt |= {"master_dtype": str(MASTER_DTYPE).removeprefix("torch."), "compute_dtype": self.cfg.dtype}
        (path / "format.json").write_text(json.dumps(fmt))

    def load_checkpoint(self, directory: str) -> None:
        path = Path(directory)
        self._load_model_weights(path / "model")
        if self.sharded:
            from posttrain.modeling.fsdp import load_optimizer_shard_state

            state = torch.load(
                path / f"optimizer_rank{self.rank}.pt", map_location=self.device, weights_only=False
            )
            load_optimizer_shard_state(self.model, self.optimizer, state["optimizer"])
        else:
            state = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rng_file = path / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=False))

    def _load_model_weights(self, model_dir: Path) -> None:
        if self.lora:
            from posttrain.models.lora import load_adapter

            self._copy_into_model(load_adapter(self.model, model_dir))
            return
        saved = read_safetensors(model_dir)
        if not self.sharded:
            check_weights_match(self.model, saved, where=str(model_dir))
        self._copy_into_model(saved)

    def _copy_into_model(self, saved: dict[str, torch.Tensor]) -> None:
        """Full tensors by state-dict name into the model (FSDP2: scattered into the shards)."""
        if self.sharded:
            from posttrain.modeling.fsdp import load_full_model_state

            load_full_model_state(self.model, saved)
            return
        copy_into(self.model, saved)


def read_safetensors(model_dir: Path, what: str = "model") -> dict[str, torch.Tensor]:
    """Every tensor of the *.safetensors files in `model_dir`; CheckpointMismatchError ("no {what}
    weights") when there are none."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointMismatchError(f"no {what} weights (*.safetensors) in {model_dir}")
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        saved.update(load_file(f))
    return saved


def copy_into(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copy full tensors by state-dict name into an unsharded model, in place."""
    with torch.no_grad():
        own = model.state_dict()
        for name, tensor in saved.items():
            own[name].copy_(tensor)


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The full tensor of a parameter: FSDP2 shards are DTensors, gathered (a collective) here."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def check_weights_match(model: torch.nn.Module, saved: dict[str, torch.Tensor], *, where: str) -> None:
    """Raise CheckpointMismatchError unless `saved` has every (untied) tensor of `model` with its shape."""
    own = model.state_dict()
    first_name_of: dict[int, str] = {}
    tied = set()  # later names of a shared tensor (e.g. lm_head.weight tied to the embeddings)
    for name, tensor in own.items():
        if tensor.data_ptr() in first_name_of:
            tied.add(name)
        first_name_of.setdefault(tensor.data_ptr(), name)
    missing = [n for n in own if n not in saved and n not in tied]
    unexpected = [n for n in saved if n not in own]
    wrong = [n for n in saved if n in own and tuple(saved[n].shape) != tuple(own[n].shape)]
    if missing or unexpected or wrong:
        examples = [f"missing {n}" for n in missing[:2]] + [f"unexpected {n}" for n in unexpected[:2]]
        examples += [
            f"{n}: checkpoint {tuple(saved[n].shape)} vs model {tuple(own[n].shape)}" for n in wrong[:2]
        ]
        raise CheckpointMismatchError(
            f"the checkpoint at {where} does not match the configured policy model "
            f"({len(missing)} missing, {len(unexpected)} unexpected, {len(wrong)} wrong-shape tensors; e.g. "
            f"{'; '.join(examples)}). Resume with the model it was saved from, point checkpoint.resume at "
            "another checkpoint, or start fresh with checkpoint.resume=none or a new logging.run_dir."
        )


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
