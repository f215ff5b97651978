"""`posttrain <command> [--config FILE] [key.path=value ...]`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from posttrain.config.loader import ConfigError, load_config, to_yaml
from posttrain.config.schema import ALGORITHM_CONFIGS


def _trainer(name: str) -> Callable:
    if name == "sft":
        from posttrain.trainers.sft import run_sft

        return run_sft
    if name == "grpo":
        from posttrain.trainers.grpo import run_grpo

        return run_grpo
    if name == "dpo":
        from posttrain.trainers.dpo import run_dpo

        return run_dpo
    if name == "rm":
        from posttrain.trainers.rm import run_rm

        return run_rm
    raise KeyError(name)


def _train_command(args: argparse.Namespace) -> int:
    config = load_config(ALGORITHM_CONFIGS[args.command], args.config, args.overrides)
    if args.print_config:
        print(to_yaml(config), end="")
        return 0
    _trainer(args.command)(config)
    return 0


def _models_command(args: argparse.Namespace) -> int:
    from posttrain.models import hub

    if args.action == "list":
        for alias, description, pulled in hub.list_models():
            print(f"{alias:28s} {'pulled ' if pulled else 'not pulled'}  {description}")
        return 0
    for name in args.names:
        path = hub.pull_model(name, force=args.force)
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ALGORITHM_CONFIGS:
        p = sub.add_parser(
            name, help="train a reward model" if name == "rm" else f"train with {name.upper()}"
        )
        p.add_argument("--config", help="a YAML recipe (e.g. examples/configs/sft.yaml)")
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. policy.optimizer.lr=1e-5")
        p.set_defaults(func=_train_command)
    models = sub.add_parser("models", help="models obtainable without a hub")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list", help="list model aliases")
    pull = models_sub.add_parser("pull", help="fetch a model alias into the local cache")
    pull.add_argument("names", nargs="+")
    pull.add_argument("--force", action="store_true")
    models.set_defaults(func=_models_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"posttrain: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
