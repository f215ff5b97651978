import itertools
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.config import ALGORITHM_CONFIGS, ConfigError, load_config
from posttrain.config.supervised import SFTConfig

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "configs").glob("*.yaml"))


def test_there_are_example_configs():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_validates(path):
    algorithm = next(name for name in ALGORITHM_CONFIGS if path.name.startswith(name))
    load_config(ALGORITHM_CONFIGS[algorithm], path)


def test_misspelled_key_fails_with_path_and_suggestion():
    with pytest.raises(
        ConfigError,
        match=r"unknown key `policy.optimizer.weight_decy`. Did you mean `policy.optimizer.weight_decay`\?",
    ) as e:
        load_config(SFTConfig, None, ["policy.optimizer.weight_decy=1"])
    assert "Valid keys here: lr, weight_decay" in str(e.value)
    with pytest.raises(ConfigError, match=r"unknown key `sft.max_step`. Did you mean `sft.max_steps`\?"):
        load_config(SFTConfig, None, ["sft.max_step=3"])


def test_wrong_type_names_key_and_expected_type():
    with pytest.raises(ConfigError, match=r"`policy.optimizer.lr`: Input should be a valid number.*'fast'"):
        load_config(SFTConfig, None, ["policy.optimizer.lr=fast"])
    with pytest.raises(ConfigError, match=r"`cluster.backend`: Input should be 'ray' or 'local'"):
        load_config(SFTConfig, None, ["cluster.backend=slurm"])


def test_defaults_inheritance_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "policy: {max_seq_len: 100, optimizer: {lr: 0.1}}\nsft: {max_steps: 5}\n"
    )
    (tmp_path / "child.yaml").write_text("defaults: base.yaml\npolicy: {optimizer: {weight_decay: 0.5}}\n")
    cfg = load_config(SFTConfig, tmp_path / "child.yaml", ["sft.max_steps=7", "policy.optimizer.lr=1e-5"])
    assert (cfg.policy.max_seq_len, cfg.policy.optimizer.weight_decay) == (100, 0.5)
    assert (cfg.sft.max_steps, cfg.policy.optimizer.lr) == (7, 1e-5)
    # keys the recipe does not name keep the algorithm's defaults
    assert cfg.policy.scheduler.warmup_steps == SFTConfig().policy.scheduler.warmup_steps == 5


def test_naming_a_file_source_replaces_the_generated_default():
    cfg = load_config(SFTConfig, None, ["data.train.path=my.jsonl"])
    assert cfg.data.train.path == "my.jsonl" and cfg.data.train.reasoning_gym is None
    # overriding one field of the generated source keeps its other fields
    cfg = load_config(SFTConfig, None, ["data.validation.reasoning_gym.size=3"])
    assert cfg.data.validation.reasoning_gym.size == 3
    assert cfg.data.validation.reasoning_gym.kwargs == SFTConfig().data.validation.reasoning_gym.kwargs != {}
    with pytest.raises(ConfigError, match="set exactly one of `path`"):
        load_config(SFTConfig, None, ["data.train.path=my.jsonl", "data.train.reasoning_gym.size=3"])


def test_a_source_named_over_a_recipe_replaces_the_recipe_source(tmp_path):
    """Each layer that names a dataset source replaces the others below it: a child recipe over its
    `defaults:` parent, and command-line overrides over a recipe (the quickstart recipe names
    `reasoning_gym` on both splits)."""
    quickstart = Path(__file__).parents[2] / "examples" / "configs" / "grpo_math.yaml"
    (tmp_path / "child.yaml").write_text(
        f"defaults: {quickstart}\ndata:\n  train: {{path: my.jsonl}}\n"
        "  validation: {environment_tasks: {size: 8}}\n"
    )
    from posttrain.config.rl import GRPOConfig

    cfg = load_config(GRPOConfig, tmp_path / "child.yaml")
    assert cfg.data.train.path == "my.jsonl" and cfg.data.train.reasoning_gym is None
    assert cfg.data.validation.environment_tasks.size == 8 and cfg.data.validation.reasoning_gym is None
    cfg = load_config(GRPOConfig, quickstart, ["data.train.path=my.jsonl", "data.validation.path=val.jsonl"])
    assert (cfg.data.train.path, cfg.data.validation.path) == ("my.jsonl", "val.jsonl")
    assert cfg.data.train.reasoning_gym is None and cfg.data.validation.reasoning_gym is None
    # a field of the recipe's own source keeps the source; null drops nothing
    cfg = load_config(GRPOConfig, quickstart, ["data.train.reasoning_gym.size=7", "data.train.path=null"])
    assert cfg.data.train.reasoning_gym.size == 7 and cfg.data.train.reasoning_gym.seed == 11
    # two sources named by the overrides themselves are the user's conflict
    with pytest.raises(ConfigError, match="set exactly one of `path`"):
        load_config(GRPOConfig, quickstart, ["data.train.path=my.jsonl", "data.train.reasoning_gym.size=3"])


def test_naming_environment_tasks_replaces_the_generated_default():
    """GRPO's default data are generated reasoning-gym sums; a run on an environment's own tasks names
    `environment_tasks` alone (it used to need `reasoning_gym: null` beside it on each split)."""
    from posttrain.config.rl import GRPOConfig

    overrides = [
        "environment.name=wordle",
        "environment.max_turns=6",
        "data.train.environment_tasks.size=100",
        "data.validation.environment_tasks.size=8",
    ]
    cfg = load_config(GRPOConfig, None, overrides)
    assert cfg.data.train.reasoning_gym is None and cfg.data.train.environment_tasks.size == 100
    assert cfg.data.validation.reasoning_gym is None and cfg.data.validation.environment_tasks.size == 8


def test_cli_print_config_and_config_errors(capsys):
    assert main(["sft", "--print-config", "sft.max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 3" in out and "model_name: smollm2-135m-instruct" in out
    assert main(["sft", "--print-config", "sft.max_stepz=3"]) == 2
    assert "Did you mean `sft.max_steps`?" in capsys.readouterr().err


def test_quickstart_recipes_spell_out_the_defaults():
    """`posttrain grpo` with no arguments runs exactly examples/configs/grpo_math.yaml (and sft likewise)."""
    from posttrain.config.rl import GRPOConfig

    root = Path(__file__).parents[2] / "examples" / "configs"
    for name, model in (("grpo_math.yaml", GRPOConfig), ("sft.yaml", SFTConfig)):
        recipe = load_config(model, root / name).model_dump()
        default = model().model_dump()
        recipe["logging"].pop("run_dir"), default["logging"].pop("run_dir")
        assert recipe == default, name


def test_vllm_cpu_binding_gives_each_rank_its_own_cores(monkeypatch):
    from posttrain.config.rollout import VLLMConfig
    from posttrain.generation.vllm_engine import cpu_environment

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    cfg = VLLMConfig(cpu_kv_cache_gib=2)
    assert cpu_environment(cfg, 4, rank=0)["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert cpu_environment(cfg, 4, rank=1)["VLLM_CPU_OMP_THREADS_BIND"] == "4-7"
    assert cpu_environment(cfg, 1, rank=9)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert cpu_environment(cfg, 4, rank=0)["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_compiled_vllm_on_cpu_without_a_cpp_compiler_is_refused_clearly(monkeypatch, tmp_path):
    import torch

    from posttrain.config.rollout import VLLMConfig
    from posttrain.generation.vllm_engine import VLLMGenerator

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no compiler on it
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(RuntimeError, match="enforce_eager=true"):
        VLLMGenerator(
            VLLMConfig(enforce_eager=False),
            model_path="unused",
            tokenizer_path="unused",
            dtype="float32",
            max_model_len=64,
            seed=0,
            device=torch.device("cpu"),
        )


def test_refit_transport_auto_and_impossible_choices():
    from posttrain.config.common import ClusterConfig
    from posttrain.config.rl import GRPOConfig
    from posttrain.config.rollout import GenerationConfig

    auto = GenerationConfig(placement="split")
    picks = {
        (1, 0, "ray"): "shared_memory",
        (1, 0, "local"): "shared_memory",
        (2, 0, "ray"): "object_store",
        (1, 8, "ray"): "collective",
        (2, 8, "ray"): "collective",
        (1, 1, "local"): "object_store",
    }
    for (nodes, gpus, backend), want in picks.items():
        cluster = ClusterConfig(num_nodes=nodes, gpus_per_node=gpus, backend=backend)
        assert auto.resolved_refit_transport(cluster) == want, (nodes, gpus, backend)
    # an FSDP2-sharded policy on one CPU machine: no process holds the whole weights to share
    assert auto.resolved_refit_transport(ClusterConfig(backend="ray"), sharded=True) == "collective"
    assert auto.resolved_refit_transport(ClusterConfig(backend="local"), sharded=True) == "object_store"
    explicit = GenerationConfig(refit_transport="collective")
    assert explicit.resolved_refit_transport(ClusterConfig()) == "collective"
    split = ["generation.placement=split"]
    with pytest.raises(ConfigError, match="cannot serve an FSDP2-sharded policy"):
        load_config(
            GRPOConfig, None, [*split, "generation.refit_transport=shared_memory", "policy.fsdp=true"]
        )
    with pytest.raises(ConfigError, match="shared_memory needs one CPU machine"):
        load_config(
            GRPOConfig, None, [*split, "generation.refit_transport=shared_memory", "cluster.gpus_per_node=8"]
        )
    with pytest.raises(ConfigError, match="NCCL refuses"):
        load_config(
            GRPOConfig,
            None,
            [
                *split,
                "generation.refit_transport=collective",
                "cluster.backend=local",
                "cluster.gpus_per_node=1",
            ],
        )
    # colocated placement does not refit between processes: the field is not checked there
    load_config(GRPOConfig, None, ["generation.refit_transport=shared_memory", "cluster.gpus_per_node=8"])
    with pytest.raises(ConfigError, match="Did you mean `generation.refit_transport`"):
        load_config(GRPOConfig, None, ["generation.refit_transpor=collective"])


def test_reward_model_training_refuses_fsdp():
    with pytest.raises(ConfigError, match="does not support policy.fsdp"):
        load_config(ALGORITHM_CONFIGS["rm"], None, ["policy.fsdp=true"])


def test_grpo_minibatches_must_split_over_the_policy_workers():
    """Accepted configs are exactly those whose minibatches shard evenly (the trainer's own split);
    on the old code 8 x 4 rollouts, updates_per_batch=3 and 2 workers were accepted and the first
    update failed in `TokenBatch.shards`."""
    from posttrain.config.rl import GRPOConfig
    from posttrain.data.batching import TokenBatch

    def cfg(prompts: int, generations: int, updates: int, workers: int) -> GRPOConfig:
        overrides = {
            "grpo.prompts_per_step": prompts,
            "grpo.generations_per_prompt": generations,
            "grpo.updates_per_batch": updates,
            "cluster.num_workers": workers,
        }
        return load_config(GRPOConfig, None, [f"{k}={v}" for k, v in overrides.items()])

    with pytest.raises(
        ConfigError,
        match=r"updates_per_batch=3 does not split .* 32 .* Set grpo.updates_per_batch to one of \[1, 2, 4, 8, 16\]",
    ):
        cfg(8, 4, 3, 2)
    with pytest.raises(ConfigError, match="updates_per_batch=1 does not split the rollout batch of 6"):
        cfg(3, 2, 1, 4)
    for prompts, generations, updates, workers in itertools.product(
        [1, 3, 4], [2, 3, 4], [1, 2, 3], [1, 2, 4]
    ):
        rows = prompts * generations
        batch = TokenBatch(
            torch.zeros(rows, 3, dtype=torch.long), torch.ones(rows, 3, dtype=torch.long), torch.ones(rows, 3)
        )
        try:  # the split GRPOTrainer.train_on and PolicyGroup.train make
            [mb.shards(workers) for mb in batch.chunks(updates)]
            splits = len(batch.chunks(updates)) == updates
        except ValueError:
            splits = False
        try:
            cfg(prompts, generations, updates, workers)
            accepted = True
        except ConfigError:
            accepted = False
        assert accepted == splits, (prompts, generations, updates, workers)
