"""`posttrain <command> [--config FILE] [key.path=value ...]`.

Errors of the user's own making (`posttrain.errors.UserError`: a bad config, a missing file, a
malformed data row) print one line, `error: ...`, and exit with status 2; `--debug` or
POSTTRAIN_DEBUG=1 shows their traceback. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable

from pydantic import BaseModel

from posttrain.config.commands import COMMANDS
from posttrain.config.loader import load_config, to_yaml
from posttrain.errors import UserError


def _trainer(name: str) -> Callable:
    """The function `posttrain <name>` runs with its config (eval also prints its summary)."""
    run = COMMANDS[name].run_function()
    return _print_eval(run) if name == "eval" else run


def _print_eval(run_eval: Callable) -> Callable:
    def run(config: object) -> None:
        result = run_eval(config)
        keys = ("pass@", "cons@", "accuracy", "mean_reward", "loss", "perplexity")
        shown = {k: v for k, v in result.summary.items() if k.startswith(keys)}
        print("  ".join(f"{k}={v:.4f}" for k, v in shown.items()))
        print(f"wrote {result.output_dir / 'summary.json'} and {result.output_dir / 'samples.jsonl'}")

    return run


def _export_command(args: argparse.Namespace) -> int:
    from posttrain.checkpoint.export import export_checkpoint

    result = export_checkpoint(
        args.checkpoint, args.out_dir, dtype=args.dtype, overwrite=args.overwrite, adapter=args.adapter
    )
    template = "with" if result.has_chat_template else "WITHOUT"
    print(
        f"exported {result.checkpoint} (step {result.step}) to {result.path}, tokenizer {template} chat template"
    )
    return 0


def _train_command(args: argparse.Namespace) -> int:
    config = load_config(COMMANDS[args.command].config, args.config, args.overrides)
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


def _doctor_command(args: argparse.Namespace) -> int:
    from posttrain.doctor import doctor

    return doctor(args.config, args.algorithm, args.overrides, smoke=args.smoke)


def _env_command(args: argparse.Namespace) -> int:
    """`posttrain env serve NAME ...`: serve a registered environment as an OpenEnv server."""
    from posttrain.config.loader import apply_overrides

    try:
        from posttrain.serve.openenv_server import serve
    except ImportError as e:
        raise UserError(
            f"posttrain env serve needs the serve extra ({e}); pip install 'posttrain[serve]'"
        ) from e
    kwargs = apply_overrides({}, args.kwargs)
    print(f"serving environment {args.name!r} as OpenEnv on http://{args.host}:{args.port}", flush=True)
    serve(
        args.name,
        kwargs,
        host=args.host,
        port=args.port,
        workers=args.workers,
        max_concurrency=args.max_concurrency,
    )
    return 0


class _IntermixedParser(argparse.ArgumentParser):
    """Positionals may come after options (`serve NAME --port 1 max_moves=10`), as in Python 3.12's argparse."""

    _inside = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._inside:  # parse_known_intermixed_args calls back here
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def _add_env_parser(sub: argparse._SubParsersAction, debug: argparse.ArgumentParser) -> None:
    """The `env` command: `env serve NAME --port P [--host H] [--workers N] [--max-concurrency K] [k=v ...]`."""
    env = sub.add_parser("env", help="environments as services", parents=[debug])
    env_sub = env.add_subparsers(dest="action", required=True, parser_class=_IntermixedParser)
    text = "serve a registered environment as an OpenEnv server (needs the serve extra); see docs/serve.md"
    serve = env_sub.add_parser("serve", help=text, description=text, parents=[debug])
    serve.add_argument("name", help="a registered environment (math, sliding_puzzle, ...) or module:Class")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    serve.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    serve.add_argument(
        "--max-concurrency", type=int, default=64, help="sessions (episodes) at once per process (default 64)"
    )
    serve.add_argument("kwargs", nargs="*", help="environment kwargs as dotted overrides, e.g. max_moves=10")
    serve.set_defaults(func=_env_command)


DEBUG_HELP = "show the traceback of configuration and data errors too (or set POSTTRAIN_DEBUG=1)"

REFERENCE = "docs/configuration.md"


def key_default(config: type[BaseModel], key: str) -> tuple[object, str]:
    """(default, first sentence of the description) of dotted `key` in the config model `config`;
    KeyError naming the key when the model has no such field."""
    node: object = config()
    description = ""
    for part in key.split("."):
        fields = type(node).model_fields if isinstance(node, BaseModel) else {}
        if part not in fields:
            raise KeyError(f"{config.__name__} has no key {key!r}")
        description = (fields[part].description or "").split(". ")[0].rstrip(".")
        node = getattr(node, part)
    return node, description


def main_keys_help(command: str, width: int | None = None) -> str:
    """The epilog of a command's --help: its main keys as `key=default  description` lines (each cut to
    `width`, default the terminal's), then where every other key is documented."""
    width = max(40, width or shutil.get_terminal_size().columns)
    rows = [(key, *key_default(COMMANDS[command].config, key)) for key in COMMANDS[command].main_keys]
    cells = [(f"{key}={_shown(value)}", text) for key, value, text in rows]
    pad = max(len(cell) for cell, _ in cells) + 2
    lines = ["main settings (key=default; set any on the command line as key=value):"]
    for cell, text in cells:
        line = f"  {cell.ljust(pad)}{text}".rstrip()
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    lines += [
        f"every key, its type, default and description: {REFERENCE}",
        f"the resolved config of a command line: posttrain {command} [--config FILE] [key=value ...] --print-config",
    ]
    return "\n".join(lines)


def _shown(value: object) -> str:
    """A default as it is written on the command line: null, true/false, lists as JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # also accepted after the command; SUPPRESS keeps a subcommand from resetting the top-level flag
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=command.help,
            description=command.help,
            parents=[debug],
            epilog=main_keys_help(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--config", help="a YAML recipe (e.g. examples/configs/sft.yaml)")
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. policy.optimizer.lr=1e-5")
        p.set_defaults(func=_train_command)
    models = sub.add_parser("models", help="models obtainable without a hub", parents=[debug])
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list", help="list model aliases")
    pull = models_sub.add_parser("pull", help="fetch a model alias into the local cache")
    pull.add_argument("names", nargs="+")
    pull.add_argument("--force", action="store_true")
    models.set_defaults(func=_models_command)
    export = sub.add_parser("export", help="turn a checkpoint into a Hugging Face folder", parents=[debug])
    export.add_argument("checkpoint", help="a step_* checkpoint folder, or a run directory (its latest)")
    export.add_argument("out_dir")
    export.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="cast the weights (default: the run's policy.dtype)"
    )
    export.add_argument("--overwrite", action="store_true", help="replace out_dir if it exists")
    export.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA checkpoints: write the peft adapter folder instead of the merged model",
    )
    export.set_defaults(func=_export_command)
    doc = sub.add_parser(
        "doctor", help="check this machine for a run; print the fix for each problem", parents=[debug]
    )
    doc.add_argument("--config", help="check what this recipe needs (default: the grpo quickstart)")
    doc.add_argument("--algorithm", choices=list(COMMANDS), help="the command the config is for")
    doc.add_argument("--smoke", action="store_true", help="also run one GRPO step on a tiny random model")
    doc.add_argument("overrides", nargs="*", help="dotted overrides, e.g. generation.backend=vllm")
    doc.set_defaults(func=_doctor_command)
    _add_env_parser(sub, debug)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a `UserError` prints `error: <message>` and returns 2 (no traceback)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        if args.debug or os.environ.get("POSTTRAIN_DEBUG", "") not in ("", "0"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
