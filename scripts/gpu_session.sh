#!/usr/bin/env bash
# One call on the GPU machine (issue 27): versions, the CUDA tests, scripts/gpu_check.py, a host-time probe
# (scripts/gpu_probe.py), the GPU benchmark.
#
# From the repository root on the device machine:
#     bash scripts/gpu_session.sh                      # every step
#     STEPS=tests,bench BENCH_ARGS="--only llama" bash scripts/gpu_session.sh
# Each step runs under its own timeout (TESTS_S, CHECK_S, BENCH_S seconds) and writes its log as it goes;
# the logs are packed into $OUT/logs.tgz (one file back), the benchmark's page to $OUT/gpu.md, and the
# last lines printed are a summary.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
STEPS=${STEPS:-tests,check,probe,bench}
summary=()

{
    date -u
    nvidia-smi -L
    python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, \
triton.__version__, transformers.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
    git log --oneline -1 2> /dev/null
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

if [[ $STEPS == *tests* ]]; then
    # The CUDA-marked tests and every executor test (Triton on CUDA here), with the CUDA parts of issue 26.
    # gpu_check's own test is left to the check step, which runs the same script with its log kept.
    timeout "${TESTS_S:-170}" python3 -m pytest -q -n "${TEST_WORKERS:-8}" -rfEs -p no:cacheprovider \
        ${TESTS:-tests/executors tests/runtime/test_cuda_graphs.py tests/ops/test_devices.py \
        tests/models/test_optimizers_devices.py tests/transforms/test_grad_native_kernels.py} \
        --deselect tests/executors/test_gpu_check.py::test_gpu_check_passes_on_cuda > "$LOGS/tests.txt" 2>&1
    summary+=("tests rc=$? $(tail -1 "$LOGS/tests.txt")")
fi
if [[ $STEPS == *check* ]]; then
    timeout "${CHECK_S:-100}" python3 scripts/gpu_check.py --log "$LOGS/gpu_check.log" > "$LOGS/gpu_check.txt" 2>&1
    summary+=("gpu_check rc=$?")
fi
if [[ $STEPS == *probe* ]]; then
    # shellcheck disable=SC2086  # PROBE_ARGS is a list of arguments
    timeout "${PROBE_S:-90}" python3 scripts/gpu_probe.py ${PROBE_ARGS:-} > "$LOGS/probe.txt" 2>&1
    summary+=("probe rc=$?")
fi
if [[ $STEPS == *bench* ]]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    timeout "${BENCH_S:-300}" python3 scripts/bench.py --device cuda --out "$OUT/gpu.md" --json "$LOGS/bench.jsonl" \
        ${BENCH_ARGS:-} > "$LOGS/bench.txt" 2> "$LOGS/bench_progress.txt"
    summary+=("bench rc=$?")
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "== failures"
tar xzf "$OUT/logs.tgz" -O logs/tests.txt 2> /dev/null | grep -E "^(FAILED|ERROR)" | head -40
tar xzf "$OUT/logs.tgz" -O logs/gpu_check.txt 2> /dev/null | tail -25
tar xzf "$OUT/logs.tgz" -O logs/probe.txt 2> /dev/null | head -8
tar xzf "$OUT/logs.tgz" -O logs/bench.txt 2> /dev/null | tail -40
printf '%s\n' "${summary[@]}"
