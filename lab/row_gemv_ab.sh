#!/usr/bin/env bash
# The H200 A/B of fused.ROW_GEMV_MAX (a few rows' projections as one-row GEMVs side by side)
# against the norm kernel + few-row tl.dot GEMM: spec_phase_bench (verify, draft, draft_extend)
# and decode_bench at batch 1-8, alternated in separate processes, ROUNDS (1 2) rounds, R (16).
#   OUT=... bash lab/row_gemv_ab.sh   (random weights: no GGUF)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/row_gemv}; mkdir -p "$OUT"
for round in ${ROUNDS:-1 2}; do
  for r in 0 "${R:-16}"; do
    for t in ${TARGETS:-smollm2-shape:default}; do
      timeout "${PHASE_S:-80}" python3 benchmarks/spec_phase_bench.py --target "${t%%:*}" \
        --draft "${t#*:}" --batch-sizes 1,8 --shapes 3,1,4 4,8,12 --iters 10 --row-gemv "$r" \
        --out "$OUT/phase_${t%%:*}_r${r}_${round}.json" 2>&1 | grep -E "^\S+ +[0-9]+,[0-9]+,[0-9]+ " | sed "s/^/r=$r $t /"
    done
    timeout "${DECODE_S:-45}" python3 benchmarks/decode_bench.py --model smollm2-shape --device cuda \
      --mode graphed --batch-sizes 1,2,4,8 --context 512 --tokens 64 --row-gemv "$r" |
      grep -E "^ +[0-9]+ +[0-9]" | sed "s/^/r=$r decode /"
  done
done
