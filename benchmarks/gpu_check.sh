#!/usr/bin/env bash
# GPU checks in one prepared run (about 5 minutes on one H200, under 10):
#   1. tests/gpu (skipped cleanly without CUDA),
#   2. the GPT-2-small (124M) tokens/s and MFU benchmark, bf16-mixed, compile off and on,
#   3. splitsync's per-step overhead on the GPU (one process, W1 and W2),
#   4. splitsync plan for the same model on NVLink 4, for the record.
# Results go to $OUT (or ./gpu-results): one text or JSON file per step, and summary.md.
# Run from the repository root:  bash benchmarks/gpu_check.sh
# Smoke test of the script itself on a CPU (tiny model):
#   GPT_SIZE=tiny GPT_ARGS="--device cpu --precision 32 --compile off" bash benchmarks/gpu_check.sh
set -uo pipefail
DIR="${OUT:-gpu-results}"
mkdir -p "$DIR"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
SUMMARY="$DIR/summary.md"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$DIR/gpu.csv" 2>&1 \
  || echo "name (no nvidia-smi)" > "$DIR/gpu.csv"
note "GPU: $(tail -n +2 "$DIR/gpu.csv" | head -1)"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$SUMMARY"

if [ -d tests/gpu ]; then
  timeout 180 "$PY" -m pytest -q tests/gpu > "$DIR/tests_gpu.txt" 2>&1
  note "tests/gpu: exit $? ($(tail -1 "$DIR/tests_gpu.txt"))"
else
  note "tests/gpu: folder not present in this tree"
fi

note ""
note "## GPT-2 small (${GPT_SIZE:-124m}), bf16-mixed, one GPU"
# shellcheck disable=SC2086  # GPT_ARGS is a list of options
timeout 300 "$PY" benchmarks/gpt_mfu.py --size "${GPT_SIZE:-124m}" --batch 16 --steps 30 \
  --warmup 8 --compile both ${GPT_ARGS:-} --out "$DIR/gpt_mfu.json" 2> "$DIR/gpt_mfu.log" \
  | tee -a "$SUMMARY"
note "gpt_mfu: exit ${PIPESTATUS[0]}"

note ""
note "## Per-step overhead on the GPU (one process)"
timeout 120 "$PY" -m splitsync bench --sections overhead --procs 1 --budget 8 \
  --out "$DIR/bench" > "$DIR/bench.md" 2>&1
note "bench: exit $?"
grep '^|' "$DIR/bench.md" | tee -a "$SUMMARY"

note ""
note "## splitsync plan, GPT-2 small on NVLink 4"
step_ms=$("$PY" -c "import json; r=[x for x in json.load(open('$DIR/gpt_mfu.json')) if x.get('tokens_per_s')]; r=max(r, key=lambda x: x['tokens_per_s']); print(1e3*r['batch']*r['seq_len']/r['tokens_per_s'])" 2>/dev/null || echo 100)
"$PY" -m splitsync plan --params 124M --step-ms "$step_ms" --network nvlink4 --batch-size 16 \
  --memory-gb 141 | tee -a "$SUMMARY"
