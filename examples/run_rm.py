"""Run RM from Python: `python examples/run_rm.py [--config FILE] [key=value ...]`."""

import argparse

from posttrain.config import load_config
from posttrain.config.supervised import RMConfig
from posttrain.trainers.rm import run_rm

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = run_rm(load_config(RMConfig, args.config, args.overrides))
    print(f"finished at step {result.step}; last checkpoint {result.last_checkpoint}")
