"""Run SFT from Python: `python examples/run_sft.py [--config FILE] [key=value ...]`."""

import argparse

from posttrain.config import load_config
from posttrain.config.supervised import SFTConfig
from posttrain.trainers.sft import run_sft

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = run_sft(load_config(SFTConfig, args.config, args.overrides))
    print(f"finished at step {result.step}; last checkpoint {result.last_checkpoint}")
