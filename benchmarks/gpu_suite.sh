#!/usr/bin/env bash
# Everything posttrain checks on a CUDA machine, in one go, into one report (issue #34, item 4).
#
#   bash benchmarks/gpu_suite.sh [OUT_DIR]          # default OUT_DIR: runs/gpu_suite/<date-time>
#
# Run it first whenever a CUDA machine is available. It stops at once, exit status 2, when CUDA is
# not usable (no nvidia-smi, or torch.cuda.is_available() is false). Otherwise every part runs
# whatever happened to the parts before it, its whole output goes to OUT_DIR/<part>.log, and
# OUT_DIR/report.md gets the part's command, exit status, duration and last lines, after the
# machine's nvidia-smi. Exit status: 0 when every part passed, 1 when any failed.
#
# Parts: the GPU tests (tests/gpu, -m gpu) and the vLLM engine tests; the GRPO quickstart on one
# GPU with the HF and the vLLM generation backends (a few steps, no checkpoints); the head memory
# benchmark on CUDA; the refit and MFU benchmarks (benchmarks/vllm_refit_generation.py --refit-only,
# benchmarks/sft_mfu.py; both measure their CPU paths today, see docs/benchmarks.md).
#
# PYTHON and POSTTRAIN name the interpreter and the command line (default: python, posttrain);
# STEPS the quickstart's steps (default 3); TAIL the lines of each log in the report (default 25).
set -uo pipefail

PYTHON=${PYTHON:-python}
POSTTRAIN=${POSTTRAIN:-posttrain}
STEPS=${STEPS:-3}
TAIL=${TAIL:-25}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/runs/gpu_suite/$(date +%Y%m%d-%H%M%S)}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_suite: no nvidia-smi on PATH: this is not a CUDA machine; nothing was run" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "gpu_suite: torch.cuda.is_available() is false for $PYTHON (CPU-only torch build, or no" \
        "usable driver); nothing was run" >&2
    exit 2
fi

mkdir -p "$OUT" || { echo "gpu_suite: cannot create $OUT" >&2; exit 2; }
REPORT=$OUT/report.md
FAILED=0
cd "$ROOT" || exit 2

{
    echo "# posttrain GPU suite"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "$("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1)"
    echo
    echo '```'
    nvidia-smi 2>&1
    echo '```'
} >"$REPORT"

# part NAME COMMAND...: runs COMMAND with its output in NAME.log and appends its section to the report.
part() {
    local name=$1 status start seconds
    shift
    echo "gpu_suite: $name: $*"
    start=$(date +%s)
    "$@" >"$OUT/$name.log" 2>&1 </dev/null
    status=$?
    seconds=$(($(date +%s) - start))
    if [ "$status" -ne 0 ]; then
        FAILED=1
    fi
    {
        echo
        echo "## $name"
        echo
        echo "\`$*\`: exit status $status, ${seconds} s (full output: $name.log)"
        echo
        echo '```'
        tail -n "$TAIL" "$OUT/$name.log"
        echo '```'
    } >>"$REPORT"
    echo "gpu_suite: $name: exit status $status, ${seconds} s"
}

QUICK=(grpo.max_steps="$STEPS" grpo.val_every="$STEPS" checkpoint.enabled=false cluster.gpus_per_node=1)

part gpu_tests "$PYTHON" -m pytest -q -m gpu tests/gpu
part vllm_tests "$PYTHON" -m pytest -q -m vllm tests/vllm_engine
part quickstart_hf "$POSTTRAIN" grpo "${QUICK[@]}" logging.run_dir="$OUT/quickstart_hf"
part quickstart_vllm "$POSTTRAIN" grpo --config examples/configs/grpo_math_vllm.yaml "${QUICK[@]}" \
    logging.run_dir="$OUT/quickstart_vllm"
part head_memory "$PYTHON" benchmarks/head_memory.py --device cuda --arms plain kept recompute entropy
part refit "$PYTHON" benchmarks/vllm_refit_generation.py --refit-only --dtype bfloat16
part mfu "$PYTHON" benchmarks/sft_mfu.py --rounds 2 --steps 3

echo "gpu_suite: report in $REPORT"
exit "$FAILED"
