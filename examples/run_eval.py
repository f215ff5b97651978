"""Evaluate from Python: `python examples/run_eval.py [--config FILE] [key=value ...]`."""

import argparse

from posttrain.config import load_config
from posttrain.config.eval import EvalConfig
from posttrain.trainers.eval import run_eval

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="examples/configs/eval.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    result = run_eval(load_config(EvalConfig, args.config, args.overrides))
    for key, value in result.summary.items():
        print(f"{key}: {value}")
