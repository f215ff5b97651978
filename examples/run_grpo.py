"""Run GRPO from Python: `python examples/run_grpo.py [--config FILE] [key=value ...]`."""

import argparse

from posttrain.config import load_config
from posttrain.config.rl import GRPOConfig
from posttrain.trainers.grpo import run_grpo

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = run_grpo(load_config(GRPOConfig, args.config, args.overrides))
    print(f"finished at step {result.step}; run dir {result.run_dir}")
