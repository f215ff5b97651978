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
# benchmark on CUDA; the refit benchmark (benchmarks/vllm_refit_generation.py --refit-only, with vLLM)
# and SFT MFU on the GPU in bf16 (benchmarks/sft_mfu.py --device cuda).
#
# The quickstart runs twice: on a local Ray cluster (the default backend, the policy in a Ray actor
# given the GPU) and in-process (cluster.backend=local). The vLLM parts are skipped, and say so in the
# report, when vllm does not import.
#
# PYTHON and POSTTRAIN name the interpreter and the command line (default: python, posttrain);
# STEPS the quickstart's steps (default 3); TAIL the lines of each log in the report (default 25);
# PART_TIMEOUT, when set, stops any one part after that many seconds (exit status 124).
set -uo pipefail

PYTHON=${PYTHON:-python}
POSTTRAIN=${POSTTRAIN:-posttrain}
STEPS=${STEPS:-3}
TAIL=${TAIL:-25}
PART_TIMEOUT=${PART_TIMEOUT:-}
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
    if [ -n "$PART_TIMEOUT" ]; then
        timeout "$PART_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1 </dev/null
    else
        "$@" >"$OUT/$name.log" 2>&1 </dev/null
    fi
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

# skipped NAME WHY: records in the report a part that was not run, and why.
skipped() {
    echo "gpu_suite: $1: skipped: $2"
    printf '\n## %s\n\nskipped: %s\n' "$1" "$2" >>"$REPORT"
}

QUICK=(grpo.max_steps="$STEPS" grpo.val_every="$STEPS" checkpoint.enabled=false cluster.gpus_per_node=1)

HAVE_VLLM=1
"$PYTHON" -c 'import vllm' >/dev/null 2>&1 || HAVE_VLLM=0

part gpu_tests "$PYTHON" -m pytest -q -rs -m gpu tests/gpu
part quickstart_hf "$POSTTRAIN" grpo "${QUICK[@]}" logging.run_dir="$OUT/quickstart_hf"
part quickstart_hf_local "$POSTTRAIN" grpo "${QUICK[@]}" cluster.backend=local \
    logging.run_dir="$OUT/quickstart_hf_local"
if [ "$HAVE_VLLM" = 1 ]; then
    part vllm_tests "$PYTHON" -m pytest -q -m vllm tests/vllm_engine
    part quickstart_vllm "$POSTTRAIN" grpo --config examples/configs/grpo_math_vllm.yaml "${QUICK[@]}" \
        logging.run_dir="$OUT/quickstart_vllm"
    part refit "$PYTHON" benchmarks/vllm_refit_generation.py --refit-only --dtype bfloat16
else
    for name in vllm_tests quickstart_vllm refit; do
        skipped "$name" "vllm does not import for $PYTHON"
    done
fi
part head_memory "$PYTHON" benchmarks/head_memory.py --device cuda --arms plain kept recompute entropy
part mfu "$PYTHON" benchmarks/sft_mfu.py --device cuda --dtype bfloat16 --batch-size 32 --seq-len 512 \
    --rounds 2 --steps 3

echo "gpu_suite: report in $REPORT"
exit "$FAILED"
