"""The sections that sample and score episodes, shared by the RL trainers and eval: generation
(HF / vLLM, refit transport and checks), the environment and its agent rollouts, the episode token
budget; the settings of the sandbox that runs model-written code (`posttrain.sandbox`); and the
lookups their validators call in the floors above config (`Lookups`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_serializer, model_validator

from posttrain.config.common import ClusterConfig, LoraConfig, Strict


@dataclass(frozen=True)
class Lookups:
    """What config validation looks up in the floors above config: whether an environment name and
    its kwargs resolve, the turn limit they set, and which tool-call parsers are registered.

    `posttrain.config` may not import `posttrain.environments` or `posttrain.endpoint` (they sit above
    it, docs/architecture.md), so the package root (`posttrain/__init__.py`) installs these lookups
    (`install_lookups`) before any config is validated; they import those floors on first use. Until
    installed nothing is looked up and those checks pass (it never happens in practice: importing any
    `posttrain.<module>` runs the package root first)."""

    check_environment: Callable[[str, dict[str, Any]], None]
    """Raise ValueError (EnvironmentSpecError) unless `environment.name` resolves to an environment
    class whose constructor takes `environment.kwargs` (`environments.interface.check_environment`)."""
    turn_limit: Callable[[str, dict[str, Any]], tuple[str, int] | None]
    """(kwarg, value) bounding an episode's turns for a registered environment name; None for an
    environment without one or a name that is not registered (an import path is not imported)."""
    tool_parsers: Callable[[], Collection[str]]
    """The names of the registered tool-call parsers (`endpoint.parsers.TOOL_CALL_PARSERS`)."""


_INSTALLED: list[Lookups] = []


def install_lookups(lookups: Lookups) -> None:
    """Make `lookups` the ones config validation uses (the package root calls this once)."""
    _INSTALLED[:] = [lookups]


def installed_lookups() -> Lookups | None:
    """The installed lookups, or None before `install_lookups`."""
    return _INSTALLED[0] if _INSTALLED else None


class VLLMConfig(Strict):
    """Settings of the vLLM backend (generation.backend=vllm)."""

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="GPU: share of memory for vLLM.")
    cpu_kv_cache_gib: int = Field(1, gt=0, description="CPU: KV cache GiB (VLLM_CPU_KVCACHE_SPACE).")
    enforce_eager: bool = Field(
        True,
        description="true: the model runs eagerly, the engine starts sooner. false: vLLM compiles it (GPU: "
        "torch.compile and CUDA graphs; CPU: torch.compile with inductor, which needs a C++ compiler). "
        "Measured on a 2-core CPU, SmolLM2-135M bf16 (benchmarks/vllm_refit_generation.py): decoding "
        "2.10-2.37x transformers' generate against 1.78-1.80x eager; engine start 56-68 s against 12-13 s, "
        "at every start (vllm-cpu 0.32 cannot reload its compiled artifact). Refits write into "
        "the parameters the compiled graph reads (tested).",
    )
    prefix_caching: bool = Field(True, description="Prefill a prompt once for its G samples.")
    max_num_seqs: int = Field(256, gt=0, description="Sequences decoded together.")
    sleep: bool = Field(False, description="GPU: release vLLM's memory while the policy trains.")
    cpu_prepack: bool = Field(
        False,
        description="CPU: vLLM's prepacked oneDNN/AMX matmul weights, rebuilt after every refit: faster "
        "decoding (+12% fp32, +25% bf16 measured), slower refits (0.3-0.5 s for 135M parameters against "
        "0.06 s), linear weights held twice. false: F.linear on plain weights; a refit is one copy.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The engine's weights and compute; auto: the policy's dtype. bfloat16 under a float32 "
        "policy generates faster (GPUs; CPUs with AMX) and refits cast the weights; generation logprobs "
        "then differ more from training's (token_mult_prob_error, gen_kl); loss.importance_correction "
        "(auto: truncated in this case) corrects for it. The checksum refit check compares the policy's weights cast to this dtype.",
    )
    lora_adapter: bool = Field(
        False,
        description="With policy.lora: the engine runs the base weights with vLLM's LoRA support and each "
        "refit sends only the adapter (A, B), served as a new vLLM LoRA adapter; false: refits send the "
        "merged weights W + s·BA. The checksum refit check then compares the adapter tensors. See docs/lora.md.",
    )


class HFGenerationConfig(Strict):
    """The HF backend's sampler (posttrain's own decode loop over a transformers model)."""

    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The weights the sampler decodes from; auto: the policy's own (colocated: the trained "
        "model under policy.dtype's autocast). bfloat16 under a float32 policy: a bf16 copy of the "
        "weights, refitted after every update (cast; colocated: in the policy's process, split: in each "
        "generation worker), while training stays fp32 - half the bytes read per decoded token, and bf16 "
        "matmuls on CPUs with AVX-512 BF16 or AMX (on AVX2 alone bf16 is no faster: "
        "benchmarks/rollout_precision.py tells). Generation logprobs then differ from training's "
        "(token_mult_prob_error, gen_kl); loss.importance_correction (auto: truncated in this case) "
        "corrects for it.",
    )


class RefitCheckConfig(Strict):
    """After every weight transfer, check that the generator runs the trained weights; fail if not.

    checksum: compare (Σw, Σw²) of the policy and the engine (cheap; catches a skipped or partial
    refit). logprobs: sample a small probe batch with the generator and compare its logprobs to
    the policy's on the same tokens (token_mult_prob_error; catches anything that changes outputs).
    """

    mode: Literal["off", "checksum", "logprobs"] = "checksum"
    max_mult_prob_error: float = Field(1.02, ge=1, description="logprobs mode: fail above this.")
    prompts: int = Field(2, gt=0, description="logprobs mode: probe prompts.")
    new_tokens: int = Field(8, gt=0, description="logprobs mode: tokens sampled per probe prompt.")
    relative_tolerance: float = Field(1e-9, gt=0, description="checksum mode.")


VLLM_MAX_LORA_RANK = 512
"""The largest `max_lora_rank` vLLM accepts."""

RefitTransport = Literal["shared_memory", "object_store", "collective"]


class GenerationConfig(Strict):
    """How rollouts are sampled. Generation logprobs are of softmax(logits / temperature), the
    distribution the policy trains (temperature 1 when greedy)."""

    backend: Literal["hf", "vllm"] = "hf"
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: generate with the training weights in the policy workers; split: "
        "separate generation workers that receive new weights after each update.",
    )
    num_workers: int = Field(1, gt=0, description="Generation workers (split placement).")
    cpus_per_worker: int = Field(1, gt=0, description="CPU cores per generation worker (split placement).")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, gt=0)
    max_new_tokens: int = Field(32, gt=0)
    max_episode_tokens: int | None = Field(
        None,
        gt=0,
        description="The episode token budget: generated tokens one episode may have over all its turns "
        "(an episode that reaches it ends, truncated). It is the L_max of DAPO's soft overlong penalty "
        "and of Dr.GRPO's normaliser (loss.aggregation=seq_mean_token_sum). null: environment.max_turns "
        "× max_new_tokens (one turn: max_new_tokens). Must lie between max_new_tokens and that product, "
        "and hold dapo.overlong_buffer.",
    )
    stop_strings: list[str] = Field(default_factory=list)
    batch_size: int = Field(64, gt=0, description="Prompts per generate call.")
    hf: HFGenerationConfig = Field(default_factory=HFGenerationConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    refit_check: RefitCheckConfig = Field(default_factory=RefitCheckConfig)
    refit_transport: Literal["auto", "shared_memory", "object_store", "collective"] = Field(
        "auto",
        description="Split placement: how new weights reach the generation workers. shared_memory: they "
        "map the policy's weights, kept in /dev/shm (one CPU machine); object_store: policy rank 0 packs "
        "them into buckets that travel through the Ray object store (any nodes; via host memory); "
        "collective: policy rank 0 broadcasts the buckets over a process group of its own with the "
        "workers (NCCL on GPU, gloo on CPU). auto: shared_memory on one CPU machine, collective with "
        "GPUs on Ray, object_store otherwise (CPU across machines, or GPUs with cluster.backend=local).",
    )

    def sampling_dtype(self, policy_dtype: str) -> str:
        """The dtype the generator decodes in: its backend's `dtype` (`hf.dtype`, `vllm.dtype`), or
        `policy_dtype` where that is auto."""
        own = self.vllm.dtype if self.backend == "vllm" else self.hf.dtype
        return policy_dtype if own == "auto" else own

    def check_hf_dtype(self) -> None:
        """Raise ValueError when `hf.dtype` is set for a backend that does not read it."""
        if self.hf.dtype != "auto" and self.backend != "hf":
            raise ValueError(
                f"generation.hf.dtype={self.hf.dtype} sets the HF sampler's weights, but generation.backend="
                f"{self.backend}; set generation.vllm.dtype for a vLLM engine"
            )

    def resolved_refit_transport(self, cluster: ClusterConfig, sharded: bool = False) -> RefitTransport:
        """The transport `auto` stands for on this cluster (an explicit choice is returned as is).
        `sharded`: no process holds the generator's weights as plain parameters (FSDP2 or LoRA, see
        `PolicyConfig.split_weights`)."""
        if self.refit_transport != "auto":
            return self.refit_transport
        if cluster.gpus_per_node == 0 and cluster.num_nodes == 1 and not sharded:
            return "shared_memory"
        if (cluster.gpus_per_node > 0 or sharded) and cluster.backend == "ray":
            return "collective"
        return "object_store"

    def check_lora_adapter(self, lora: LoraConfig | None) -> None:
        """Raise ValueError when `vllm.lora_adapter` cannot work: it serves the policy's LoRA adapter
        with vLLM's LoRA support (ranks up to 512; dropout and init only matter in training)."""
        if not self.vllm.lora_adapter:
            return
        if self.backend != "vllm":
            raise ValueError(
                "generation.vllm.lora_adapter=true serves the adapter with vLLM's LoRA support, but "
                f"generation.backend={self.backend}; set generation.backend=vllm or lora_adapter=false"
            )
        if lora is None:
            raise ValueError(
                "generation.vllm.lora_adapter=true serves the policy's LoRA adapter, but policy.lora is not "
                "set; set policy.lora (e.g. policy.lora.rank=16) or generation.vllm.lora_adapter=false"
            )
        if lora.rank > VLLM_MAX_LORA_RANK:
            raise ValueError(
                f"generation.vllm.lora_adapter=true: vLLM serves LoRA ranks up to {VLLM_MAX_LORA_RANK}, "
                f"policy.lora.rank={lora.rank}; lower the rank or set generation.vllm.lora_adapter=false "
                "(merged-weight refits)"
            )

    def check_refit_transport(self, cluster: ClusterConfig, sharded: bool = False) -> None:
        """Raise ValueError when split placement's refit transport cannot work on `cluster`."""
        transport = self.resolved_refit_transport(cluster, sharded)
        if transport == "shared_memory" and sharded:
            raise ValueError(
                "generation.refit_transport=shared_memory cannot serve an FSDP2-sharded policy "
                "(policy.fsdp=true) or a LoRA policy (policy.lora): no process holds the generator's "
                "weights as plain parameters. Use refit_transport=auto"
            )
        if transport == "shared_memory" and (cluster.gpus_per_node > 0 or cluster.num_nodes > 1):
            raise ValueError(
                "generation.refit_transport=shared_memory needs one CPU machine (cluster.num_nodes=1, "
                f"cluster.gpus_per_node=0; got {cluster.num_nodes} nodes, {cluster.gpus_per_node} GPUs "
                "per node): the weights are shared through /dev/shm. Use refit_transport=auto"
            )
        if transport == "collective" and cluster.backend == "local" and cluster.gpus_per_node > 0:
            raise ValueError(
                "generation.refit_transport=collective with cluster.backend=local and GPUs would put "
                "both NCCL ranks on one GPU in one process, which NCCL refuses; use cluster.backend=ray "
                "or refit_transport=object_store"
            )


class AgentConfig(Strict):
    """Which agent runs the episodes, where its reward comes from, and how the endpoint serves it.

    `environment.agent`: agent rollouts, where a user's agent drives each episode through the
    OpenAI-compatible endpoint (`posttrain.rollout.agent`, docs/agents.md)."""

    function: str | None = Field(
        None,
        description="The agent as a Python function `module:function` or `path/to/file.py:function`, called "
        "as function(base_url, session_id, task) in a thread per episode; it may return the reward (a number).",
    )
    command: list[str] | None = Field(
        None,
        description="The agent as a program: the command, run once per episode with `--base-url URL "
        "--session-id ID --task JSON` appended and OPENAI_BASE_URL / OPENAI_API_KEY set (a stock OpenAI "
        "client needs no arguments); it may POST its reward to /sessions/{id}/reward. Exit status not 0: "
        "the episode is unscored.",
    )
    reward: Literal["environment", "agent"] = Field(
        "environment",
        description="environment: the environment (`environment.name`) scores the final transcript "
        "(its step on the episode's messages); agent: the number the agent function returns or POSTs to "
        "/sessions/{id}/reward (an episode without one is unscored, never 0).",
    )
    concurrency: int | None = Field(
        None, gt=0, description="Agents running at once; null: every episode of a rollout at once."
    )
    timeout_s: float = Field(600.0, gt=0, description="An agent still running after this is unscored.")
    tool_parser: str = Field(
        "hermes",
        description="How tool calls are read from generated text: hermes (also qwen; SmolLM2, Qwen2.5/3) or "
        "llama3_json (`posttrain.endpoint.parsers`).",
    )
    stop_at_tool_call: bool = Field(
        True,
        description="End a reply at the parser's call close (hermes: `</tool_call>`) when tools are offered.",
    )
    request_sampling: bool = Field(
        False,
        description="Let a request's temperature / top_p apply; false: every request samples from the run's "
        "generation settings, the distribution the policy loss assumes.",
    )
    batch_wait_s: float = Field(
        0.1,
        ge=0,
        description="The endpoint generates the pending requests as a batch once no new one has arrived for this "
        "long (it goes at once when every running agent has a request pending).",
    )
    batch_max_wait_s: float = Field(
        1.0,
        ge=0,
        description="The longest the first pending request waits for others to join its batch.",
    )
    host: str = Field("127.0.0.1", description="Where the endpoint listens.")
    port: int = Field(0, ge=0, description="Its port; 0: a free one per rollout.")

    @model_validator(mode="after")
    def _one_agent(self) -> AgentConfig:
        """Exactly one of function and command; a registered tool-call parser (`Lookups.tool_parsers`)."""
        if (self.function is None) == (self.command is None):
            raise ValueError(
                "environment.agent needs exactly one of function (module:function) and command (a program)"
            )
        lookups = installed_lookups()
        parsers = sorted(lookups.tool_parsers()) if lookups is not None else [self.tool_parser]
        if self.tool_parser not in parsers:
            raise ValueError(f"environment.agent.tool_parser {self.tool_parser!r} is not one of {parsers}")
        return self


def named_callables(value: Any) -> Any:
    """`value` with every function in it (inside lists, tuples and dicts) replaced by its import path
    "module:qualname"; plain data unchanged."""
    if isinstance(value, dict):
        return {k: named_callables(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [named_callables(v) for v in value]
    if callable(value):
        return (
            f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__qualname__)}"
        )
    return value


class EnvironmentConfig(Strict):
    name: str = Field("math", description="A registered environment or `package.module:Class`.")
    kwargs: dict = Field(
        default_factory=dict,
        description="Constructor arguments; math: timeout_s, format_reward (for a boxed but wrong answer, 0.1); "
        "reward_fn: reward_fn as `module:function`.",
    )
    max_error_fraction: float | None = Field(
        0.5,
        ge=0,
        le=1,
        description="Stop the run with an error (naming the environment, showing the first error) when more "
        "than this fraction of one generation batch's samples are verifier errors (a reward function that "
        "raises, a verifier that times out); null: never.",
    )
    num_workers: int = Field(1, gt=0)
    max_turns: int = Field(1, gt=0)
    max_new_tokens: int | None = Field(
        None,
        gt=0,
        description="The most tokens one of this environment's turns generates; null: generation.max_new_tokens. "
        "Over several environments each can have its own (a one-word move needs 8, a tool call 48: a "
        "longer limit lets a turn run on).",
    )
    max_observation_tokens: int | None = Field(
        None,
        gt=0,
        description="A hard cap on an environment observation's content tokens (all its messages "
        "together, the cut marker included; the chat template's own tokens not counted): a longer one "
        "is cut in the middle (its start and end are kept); null: never cut. An episode that would "
        "exceed policy.max_seq_len ends, truncated, either way.",
    )
    turn_barrier: bool = Field(
        False,
        description="Multi-turn episodes: false: each episode's next turn starts as soon as its "
        "observation is ready, while the other episodes keep decoding (HF backend: a continuously "
        "batched decode; vLLM: one engine request per turn, submitted when the environment has "
        "stepped the episode); true: the turn-by-turn loop (every episode generates, then every one "
        "is stepped). An FSDP2-sharded colocated policy with the HF backend always uses the "
        "turn-by-turn loop.",
    )
    max_concurrent_steps: int = Field(
        4,
        gt=0,
        description="Without a turn barrier, environment calls run off the decoder's thread while it "
        "decodes the other episodes: at most this many calls in flight per generation worker (and "
        "at once in each Ray environment worker), for an environment that may be stepped from several "
        "threads (`concurrent_steps = True`, e.g. `latency`); any other is stepped one call at a time. "
        "Turns that end while the bound is reached wait and go together in the next call.",
    )
    agent: AgentConfig | None = Field(
        None,
        description="Agent rollouts (docs/agents.md): your agent function or program plays each episode "
        "through an OpenAI-compatible endpoint over the generator; the environment (or the agent) gives "
        "the reward. null: the environment plays the episodes in process.",
    )

    @field_serializer("kwargs", when_used="json")
    def _callables_by_name(self, kwargs: dict) -> dict:
        """config.yaml and loggers record a Python callable (the Python API's reward functions) by its
        import path, "module:qualname"."""
        return named_callables(kwargs)

    @model_validator(mode="after")
    def _resolves(self) -> EnvironmentConfig:
        """The name (or import path) is an environment class, the kwargs fit its constructor and its
        function arguments given as `module:function` import (`Lookups.check_environment`)."""
        lookups = installed_lookups()
        if lookups is not None and self.model_fields_set & {"name", "kwargs"}:
            lookups.check_environment(self.name, self.kwargs)
        return self

    @model_validator(mode="after")
    def _turn_limits_agree(self) -> EnvironmentConfig:
        """An episode the environment allows n turns needs max_turns >= n: the rollout would otherwise
        end it first and the environment's last turn (its shaped reward, its last try) is never paid.
        n: the constructor argument that bounds a registered environment's turns (`Lookups.turn_limit`;
        none for an environment without one, or an import path, which is not imported here)."""
        lookups = installed_lookups()
        limit = lookups.turn_limit(self.name, self.kwargs) if lookups and self.model_fields_set else None
        if limit is not None and limit[1] > self.max_turns:
            key, value = limit
            raise ValueError(
                f"environment.kwargs.{key}={value} is above environment.max_turns={self.max_turns}: the "
                f"rollout would end an episode after {self.max_turns} turns, before the {self.name} "
                f"environment has scored its last allowed turn (the sliding puzzle's shaped reward, "
                f"reasoning-gym's last try would never be paid). Set environment.max_turns={value}, "
                f"or environment.kwargs.{key}={self.max_turns}"
            )
        return self


def turn_token_limit(generation: GenerationConfig, environment: EnvironmentConfig) -> int:
    """The most tokens one turn of `environment` generates: its own max_new_tokens, else generation's."""
    return environment.max_new_tokens or generation.max_new_tokens


def episode_token_budget(generation: GenerationConfig, environment: EnvironmentConfig) -> int:
    """The most generated tokens of one episode: generation.max_episode_tokens, else
    environment.max_turns × the turn's limit (`turn_token_limit`: what max_turns full turns generate)."""
    if generation.max_episode_tokens is not None:
        return generation.max_episode_tokens
    return environment.max_turns * turn_token_limit(generation, environment)


def environment_sections(cfg: Any) -> dict[str, EnvironmentConfig]:
    """A config's environments by their config key: {"environment": ...} for a run over one, else
    {"environments.<name>": ...} for each named one (`environments`, posttrain.config.multienv)."""
    named = getattr(cfg, "environments", None)
    if named is None:
        return {"environment": cfg.environment}
    return {f"environments.{name}": environment for name, environment in named.items()}


def run_episode_token_budget(cfg: Any) -> int:
    """The episode token budget of a run: its environment's (`episode_token_budget`), the largest of
    them over several environments (the L_max of DAPO's overlong shaping and Dr.GRPO's normaliser)."""
    return max(episode_token_budget(cfg.generation, e) for e in environment_sections(cfg).values())


def check_episode_budget(cfg: Any) -> None:
    """Raise ValueError where the episode token budget disagrees with the limits it derives from:
    an explicit budget below one turn (max_new_tokens) or above what max_turns turns can generate,
    or a DAPO overlong buffer (the budget's last N tokens) longer than the budget. Over several
    environments, against the one whose max_turns is largest (`run_episode_token_budget`)."""
    g, sections = cfg.generation, environment_sections(cfg)
    key = max(sections, key=lambda k: sections[k].max_turns)  # the first of the largest
    turns = sections[key].max_turns
    turn = turn_token_limit(g, sections[key])
    budget, most = episode_token_budget(g, sections[key]), turns * turn
    if g.max_episode_tokens is not None and not turn <= budget <= most:
        raise ValueError(
            f"generation.max_episode_tokens={budget} must lie between one turn (max_new_tokens={turn}, "
            f"{key}'s) and what {key}.max_turns={turns} turns generate ({most}): below, no "
            "turn could use max_new_tokens; above, no episode reaches it. Set it in that range, or null "
            f"for {most}"
        )
    buffer = getattr(getattr(cfg, "dapo", None), "overlong_buffer", None)
    if buffer is not None and buffer > budget:
        raise ValueError(
            f"dapo.overlong_buffer={buffer} is longer than the episode token budget {budget} (generation."
            f"max_episode_tokens, else {key}.max_turns × its max_new_tokens): the soft overlong "
            "penalty runs over the budget's last overlong_buffer tokens. Lower dapo.overlong_buffer or "
            "raise the budget"
        )


class SandboxConfig(Strict):
    """`posttrain.sandbox`: isolated execution of untrusted (model-written) Python code.

    Each run gets a fresh `python -I -S` in new namespaces with these limits; see docs/sandbox.md.
    """

    backend: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto",
        description="Isolation: bubblewrap, util-linux unshare, or none (rlimits only; needs "
        "allow_unsafe). auto takes the first that passes a probe run.",
    )
    allow_unsafe: bool = Field(
        False,
        description="Run code even when network or filesystem isolation is unavailable (loud warning).",
    )
    workers: int = Field(2, gt=0, description="Pre-started sandboxed interpreters (parallel runs).")
    timeout_s: float = Field(10.0, gt=0, description="Wall clock per run; the whole sandbox is killed.")
    cpu_s: int = Field(10, gt=0, description="CPU seconds per run (RLIMIT_CPU).")
    memory_mb: int = Field(1024, ge=64, description="Address space per process (RLIMIT_AS).")
    max_output_bytes: int = Field(
        65536, gt=0, description="Per stream; past it the run is killed (status output_limit)."
    )
    max_processes: int = Field(
        16, gt=0, description="Processes of the sandbox's uid (RLIMIT_NPROC); each gets memory_mb."
    )
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE.")
    max_file_mb: int = Field(16, gt=0, description="Largest file the code may write (RLIMIT_FSIZE).")
    disk_mb: int = Field(64, gt=0, description="Size of the in-memory working directory and of /tmp (each).")
    seccomp: bool = Field(
        True,
        description="Install the syscall filter (keyrings, ptrace, bpf, io_uring, namespaces... get "
        "EPERM). Off only to test the other layers alone; protections() then lists it as a problem.",
    )
