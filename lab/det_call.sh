#!/usr/bin/env bash
# One device call for issue 55's deterministic kernels when no GGUF is stashed: the mode's GPU
# kernel tests, decode_bench +- --deterministic (both shapes, b1/8/32), SmolLM2's batch-1 kernels,
# attn_bench's det variant, det_tune (SmolLM2's GEMM configs). Logs in $OUT.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; OUT=${OUT:-/tmp/det_call}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_rows_kernel.py \
  tests/test_deterministic.py -k "invariant or verify_rows or deterministic" > "$OUT/tests.log" 2>&1
tail -n 6 "$OUT/tests.log"
for m in ${MODELS:-smollm2-shape llama8b-shape}; do for d in "" --deterministic; do
  timeout ${COST_S:-100} python3 benchmarks/decode_bench.py --model $m --device cuda --mode graphed \
    --batch-sizes 1,8,32 --context 512 --tokens 64 $d > "$OUT/cost_$m$d.log" 2>&1
  grep -E "^ +(1|8|32) +[0-9]|Error" "$OUT/cost_$m$d.log" | sed "s/^/$m$d /"
done; done
[ "${EXTRA:-1}" = 1 ] && timeout 60 python3 benchmarks/decode_bench.py --model smollm2-shape --device cuda --mode graphed \
  --batch-sizes 1 --context 512 --tokens 16 --kernels --deterministic 2>&1 | grep -E " x +[0-9]+ " | head -6
[ "${EXTRA:-1}" = 1 ] && timeout 60 python3 lab/benchmarks/attn_bench.py --model default --context 512 --batch-sizes 1,8,32 \
  --phases decode,verify,verify-causal,draft_extend --variants auto,det 2>&1 | tail -14
[ "${TUNE_S:-150}" -gt 0 ] && timeout "${TUNE_S:-150}" python3 lab/benchmarks/det_tune.py --shapes smol --out "$OUT/tune.json" 2>&1 \
  | grep -v "^  smol" | tee "$OUT/tune.log" | grep -E "^smol|current|best" | head -40
