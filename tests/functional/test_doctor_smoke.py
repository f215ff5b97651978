"""`posttrain doctor --smoke`: one real GRPO step on a tiny random model in a temp dir."""

from __future__ import annotations

from posttrain.doctor import smoke_check


def test_smoke_runs_one_grpo_step(smollm_dir) -> None:
    c = smoke_check()
    assert c.status == "ok", c.detail
    assert "reached step 1, entropy " in c.detail and "nan" not in c.detail
