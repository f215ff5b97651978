"""docs/configuration.md is generated from the typed config and cannot drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "docs/gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_page_equals_the_generator_output() -> None:
    page = (ROOT / "docs/configuration.md").read_text()
    assert page == _generator().render(), "run: python docs/gen_config_reference.py"


def _section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}\n")[1].split("\n## ")[0].split("\n### ")[0]


def key(name: str) -> str:
    return f'<code class="cfg-key">{name}</code>'


def test_rows_carry_key_type_default_and_description() -> None:
    text = _generator().render()
    grpo = _section(text, "## posttrain grpo")
    cluster = _section(text, "### ClusterConfig")
    assert f"| {key('gpus_per_node')} | int | `0` | 0 trains on CPU. |" in cluster
    assert f'| {key("backend")} | "ray" or "local" | `"ray"` |' in cluster
    assert f"| {key('cluster')} | [`ClusterConfig`](#clusterconfig) |" in grpo
    # GRPO's own default of a shared section (PolicyConfig's is 512, SFT's 256) stays in its table
    assert f"| {key('policy.max_seq_len')} | int | `128` |" in grpo
    assert f"| {key('policy.max_seq_len')} | int | `256` |" in _section(text, "## posttrain sft")
    assert f"| {key('max_seq_len')} | int | `512` |" in _section(text, "### PolicyConfig")
    assert f"| {key('tokenizer_name')} | str or null | `null` | Defaults to model_name. |" in text


def test_shared_sections_are_written_once_and_linked() -> None:
    from posttrain.config.common import PolicyConfig
    from posttrain.config.rollout import GenerationConfig, VLLMConfig

    text = _generator().render()
    for cls in (PolicyConfig, GenerationConfig, VLLMConfig):
        assert text.count(f"\n### {cls.__name__}\n") == 1
        assert f"](#{cls.__name__.lower()})" in text
    for name in VLLMConfig.model_fields:  # once, in its own section
        assert text.count(f"| {key(name)} |") >= 1
        assert f"generation.vllm.{name}</code>" not in text or name == "dtype"  # eval: GRPO's differ
    assert text.count(key("policy.packed_sequences")) == 0  # same default everywhere: only PolicyConfig's row


def test_every_key_of_every_command_is_documented() -> None:
    """Each dotted key is a row of its command's table, or lies in a linked shared section that has it."""

    from posttrain.config.commands import ALGORITHM_CONFIGS

    gen = _generator()
    text = gen.render()
    for command, model in ALGORITHM_CONFIGS.items():
        table = _section(text, f"## posttrain {command}")
        for dotted in _keys(model()):
            parts = dotted.split(".")
            if key(dotted) in table:
                continue
            # the deepest linked ancestor's section has the rest of the key
            found = False
            for cut in range(len(parts) - 1, 0, -1):
                head = ".".join(parts[:cut])
                row = next((r for r in table.splitlines() if r.startswith(f"| {key(head)} | [`")), None)
                if row is not None:
                    cls = row.split("[`")[1].split("`]")[0]
                    rest = ".".join(parts[cut:])
                    found = _documented(text, cls, rest)
                    break
            assert found, f"{command}: {dotted}"


def _documented(text: str, cls: str, rest: str) -> bool:
    section = _section(text, f"### {cls}")
    if key(rest) in section:
        return True
    head, _, tail = rest.partition(".")
    row = next((r for r in section.splitlines() if r.startswith(f"| {key(head)} | [`")), None)
    return bool(tail and row and _documented(text, row.split("[`")[1].split("`]")[0], tail))


def _keys(model, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        out.append(prefix + name)
        if isinstance(value, BaseModel):
            out += _keys(value, f"{prefix}{name}.")
    return out


def test_key_cells_never_break_inside() -> None:
    """Every key cell is a `code.cfg-key`, which the site's stylesheet keeps on one line."""
    import re

    text = _generator().render()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| key |")]
    assert rows and all(re.match(r'\| <code class="cfg-key">[\w.]+</code> \|', r) for r in rows)
    css = (ROOT / "docs/stylesheets/config.css").read_text()
    assert re.search(r"code\.cfg-key \{[^}]*white-space: nowrap;", css)
    assert "stylesheets/config.css" in (ROOT / "mkdocs.yml").read_text()


def test_named_sections_link_their_class_and_required_keys_say_so() -> None:
    """`environments: dict[str, EnvironmentConfig]` links the section of its values; a key without a
    default (a source's `train`) is marked required."""
    text = _generator().render()
    grpo = _section(text, "## posttrain grpo")
    assert (
        f"| {key('environments')} | dict[str, [`EnvironmentConfig`](#environmentconfig)] or null | `null` |"
        in grpo
    )
    source = _section(text, "### TaskSourceConfig")
    assert f"| {key('train')} | [`DatasetConfig`](#datasetconfig) | required |" in source
    assert f"| {key('weight')} | float | `1.0` |" in source
