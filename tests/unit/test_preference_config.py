"""DPO / RM configs: the quickstart recipes spell out the defaults; option errors are clear."""

from pathlib import Path

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config.commands import ALGORITHM_CONFIGS
from posttrain.config.supervised import DPOConfig, RMConfig

CONFIGS = Path(__file__).parents[2] / "examples" / "configs"


@pytest.mark.parametrize(("name", "model"), [("dpo.yaml", DPOConfig), ("rm.yaml", RMConfig)])
def test_quickstart_recipes_spell_out_the_defaults(name, model):
    recipe = load_config(model, CONFIGS / name).model_dump()
    default = model().model_dump()
    recipe["logging"].pop("run_dir"), default["logging"].pop("run_dir")
    assert recipe == default, name


def test_commands_are_registered():
    assert ALGORITHM_CONFIGS["dpo"] is DPOConfig and ALGORITHM_CONFIGS["rm"] is RMConfig


def test_option_errors():
    with pytest.raises(ConfigError, match="label_smoothing applies to loss_type=sigmoid"):
        load_config(DPOConfig, None, ["dpo.loss_type=ipo", "dpo.label_smoothing=0.1"])
    with pytest.raises(ConfigError, match=r"`dpo.loss_type`: Input should be 'sigmoid' or 'ipo'"):
        load_config(DPOConfig, None, ["dpo.loss_type=hinge"])
    with pytest.raises(ConfigError, match="Did you mean `rm.max_steps`"):
        load_config(RMConfig, None, ["rm.max_step=3"])
    with pytest.raises(ConfigError, match="set exactly one of `path`"):
        load_config(DPOConfig, None, ["data.train.path=p.jsonl", "data.train.reasoning_gym.size=3"])
    cfg = load_config(DPOConfig, None, ["data.train.path=p.jsonl"])
    assert cfg.data.train.reasoning_gym is None and cfg.data.train.system_prompt is None
    assert DPOConfig().data.train.reasoning_gym.system_prompt == "Put the final answer in \\boxed{}."
