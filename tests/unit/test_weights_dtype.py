"""`weights_dtype`: which dtype a model is loaded and run in when a command says `dtype: auto`
(`posttrain eval`, a distillation teacher). A checkpoint's model/ folder takes the compute dtype its
run recorded in format.json (a bf16 run's fp32 master weights are not the function it trained: the
sliding-puzzle GRPO checkpoint solved 15/16 boards in bf16, 0/16 in fp32); any other folder float32;
an explicit dtype always wins."""

import json

from posttrain.checkpoint.export import weights_dtype


def _checkpoint(root, compute_dtype):
    step = root / "checkpoints" / "step_000003"
    (step / "model").mkdir(parents=True)
    fmt = {"model": "hf_full_state", "master_dtype": "float32"}
    if compute_dtype:
        fmt["compute_dtype"] = compute_dtype
    (step / "format.json").write_text(json.dumps(fmt))
    return step / "model"


def test_auto_takes_the_compute_dtype_of_the_checkpoint_that_holds_the_weights(tmp_path):
    assert weights_dtype("auto", str(_checkpoint(tmp_path / "bf16", "bfloat16"))) == "bfloat16"
    assert weights_dtype("auto", str(_checkpoint(tmp_path / "fp32", "float32"))) == "float32"
    assert (
        weights_dtype("auto", str(_checkpoint(tmp_path / "old", None))) == "float32"
    )  # before format.json said


def test_auto_is_float32_for_other_models_and_an_explicit_dtype_wins(tmp_path):
    hf_folder = tmp_path / "model"  # named model/, but no checkpoint around it
    hf_folder.mkdir()
    assert weights_dtype("auto", str(hf_folder)) == "float32"
    assert weights_dtype("auto", "HuggingFaceTB/SmolLM2-135M-Instruct") == "float32"
    bf16 = str(_checkpoint(tmp_path / "bf16", "bfloat16"))
    assert weights_dtype("float32", bf16) == "float32"
    assert weights_dtype("bfloat16", str(hf_folder)) == "bfloat16"


def test_a_distillation_teacher_from_a_bf16_checkpoint_runs_in_bf16(tmp_path):
    from posttrain.config.rl import TeacherConfig
    from posttrain.distributed.teacher_group import teacher_worker_kwargs

    model = str(_checkpoint(tmp_path, "bfloat16"))
    assert teacher_worker_kwargs(TeacherConfig(), model_path=model, vocab_size=None)["dtype"] == "bfloat16"
    fp32 = TeacherConfig(dtype="float32")
    assert teacher_worker_kwargs(fp32, model_path=model, vocab_size=None)["dtype"] == "float32"
