"""Run DPO from Python: `python examples/run_dpo.py [--config FILE] [key=value ...]`."""

import argparse

from posttrain.config import load_config
from posttrain.config.supervised import DPOConfig
from posttrain.trainers.dpo import run_dpo

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = run_dpo(load_config(DPOConfig, args.config, args.overrides))
    print(f"finished at step {result.step}; last checkpoint {result.last_checkpoint}")
