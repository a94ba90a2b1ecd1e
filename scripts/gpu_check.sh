#!/usr/bin/env bash
# GPU proof for kernel-level capture, in one go (about 5 minutes on one GPU, plus up to 8 for 1b):
#   1. tests/gpu (timing tier without host syncs, CUDA graph pass-through, profile tier kernels
#      and backend detection for naive/math/efficient/flash/cuDNN, user's profiler → skip)
#  1b. tests/gpu/test_graph_compile.py: the tiny Llama decode step under
#      torch.compile(mode="reduce-overhead"), attnscope's marks in cudagraph trees' graphs
#      (issue 40; five inductor compiles, hence a step and a timeout of its own)
#   2. benchmarks/bench_profile.py on CUDA, bf16 (8, 16, 1024, 64): first vs later profiled call,
#      timing-tier hot-path cost, kernels per forward and detected backend per variant
#   3. benchmarks/bench_mask_reduce.py on CUDA: calling-thread cost of counting a mask on the stream
#   4. benchmarks/bench_graph_replay.py on CUDA: host cost of an unsampled and a sampled CUDA graph
#      replay, and the replay's device time with and without attnscope's event nodes (issue 40;
#      its proof, tests/gpu/test_graph_replay.py, runs in step 1)
# Every step has its own timeout; a failing step does not stop the next one. Output goes to the
# terminal and, when $OUT is set, to $OUT/ (gpu_check.log, pytest_gpu.xml, pytest_gpu_compile.xml,
# bench_profile_cuda.json).
#
#   scripts/gpu_check.sh            # or: OUT=/tmp/gpu scripts/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-}"
if [ -n "$OUT" ]; then
  mkdir -p "$OUT"
  exec > >(tee "$OUT/gpu_check.log") 2>&1
fi
PY="${PYTHON:-python}"
status=0

echo "== environment  $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
"$PY" - <<'PY' || status=1
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    print("cudnn", torch.backends.cudnn.version())
PY

echo
echo "== 1. tests/gpu"
junit=()
[ -n "$OUT" ] && junit=(--junitxml "$OUT/pytest_gpu.xml")
timeout 300 "$PY" -m pytest tests/gpu -q -rs -s -p no:cacheprovider \
  --ignore tests/gpu/test_graph_compile.py "${junit[@]}" || status=1

echo
echo "== 1b. tests/gpu/test_graph_compile.py (CUDA graphs of torch.compile(mode=\"reduce-overhead\"))"
junit=()
[ -n "$OUT" ] && junit=(--junitxml "$OUT/pytest_gpu_compile.xml")
timeout 480 "$PY" -m pytest tests/gpu/test_graph_compile.py -q -rs -s -p no:cacheprovider \
  "${junit[@]}" || status=1

echo
echo "== 2. benchmarks/bench_profile.py --device cuda"
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  json=()
  [ -n "$OUT" ] && json=(--json "$OUT/bench_profile_cuda.json")
  timeout 300 "$PY" benchmarks/bench_profile.py --device cuda --runs 3 -n 200 "${json[@]}" || status=1
  echo
  echo "== 3. benchmarks/bench_mask_reduce.py --device cuda (mask counts enqueued on the call's stream)"
  timeout 120 "$PY" benchmarks/bench_mask_reduce.py --device cuda || status=1
  echo
  echo "== 4. benchmarks/bench_graph_replay.py --device cuda (CUDA graph replays)"
  timeout 300 "$PY" benchmarks/bench_graph_replay.py --device cuda || status=1
else
  echo "no CUDA device: benchmarks skipped"
fi

echo
echo "== done: status $status  $(date -u +%FT%TZ)"
exit $status
