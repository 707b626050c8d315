#!/usr/bin/env bash
# Decode and speculation benchmarks on a lent GPU (issue 27): one script, at most 5 minutes.
# The CPU suite never needs it. Writes $OUT/engine_speculative_cuda.json (OUT defaults to /tmp)
# and $OUT/int8_sensitivity_cuda.log; the model must be in ~/.cache/prefixgate/models (make model).
#   bash bench/device/decode_cuda.sh
# On CUDA the engine runs bf16 (its default there); int8 dequantizes inside the matmul (saves
# weight memory, not time); no 4-bit GPU kernel is wired (the int4 section stays a CPU probe).
# llama.cpp is not started: the PyPI xllamacpp build is CPU-only.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
PYTHONPATH=. timeout 270 "$PY" bench/engine_speculative.py --device cuda --no-llamacpp \
  --b1 4 --b8 8 --agree 30 --max-tokens 96 --tool-b1 4 --tool-b8 8 \
  --out "$OUT/engine_speculative_cuda.json"
echo "wrote $OUT/engine_speculative_cuda.json"
