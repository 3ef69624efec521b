"""bf16 on the GPU: how often graphed EAGLE reproduces graphed vanilla greedy decoding exactly.

In float32 the two are identical (tests/test_gpu_engine.py). In bfloat16 the verify pass scores N
tokens per request with different GEMM shapes than 1-token decode, so accumulation order differs
and a near-tie between the top two logits can flip. For every divergence this prints the
position and the top-2 logit gap of the target at that point (prefill over the common prefix).

    python lab/benchmarks/gpu_agreement.py --tokens 64 [--head DIR]   (DIR: a trained EAGLE-3 head;
                                                                   default: a random EAGLE head)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from engine_utils import prefill_logits  # noqa: E402

from hotspec import LLM, SamplingParams  # noqa: E402
from hotspec.models.default_model import default_model_path  # noqa: E402
from hotspec.models.draft_checkpoint import random_draft_checkpoint  # noqa: E402
from hotspec.models.loader import load_checkpoint  # noqa: E402

PROMPTS = [json.loads(line)["turns"][0] for line in
           open(Path(__file__).resolve().parents[2] / "hotspec" / "assets" / "prompts_small.jsonl")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--head", default=None, help="an EAGLE-3 head folder (default: random EAGLE)")
    args = p.parse_args()
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    common = dict(dtype="bfloat16", device="cuda", kv_cache_memory_gb=1.0, max_num_seqs=16,
                  cuda_graph_max_bs=16)
    van_llm = LLM(**common)
    msgs = [[{"role": "user", "content": t}] for t in PROMPTS]
    vanilla = [o.token_ids for o in van_llm.chat(msgs, sp)]
    cfg = load_checkpoint(default_model_path(), torch.float32)[0]
    tmp = Path(tempfile.mkdtemp())
    algo = "EAGLE3" if args.head else "EAGLE"
    head = args.head or random_draft_checkpoint(tmp / "e", cfg, "EAGLE", seed=1)
    tmap = str(tmp / "m.pt")
    torch.save(list(range(8192)), tmap)
    print(f"{'config':<22} {'identical':>10} {'mean match %':>13}  divergences (pos: gap)")
    for name, shape, hot in [("chain", (5, 1, 6), None), ("tree", (6, 8, 16), None),
                             ("chain+frspec8k", (5, 1, 6), tmap), ("tree+frspec8k", (6, 8, 16), tmap)]:
        llm = LLM(**common, speculative_algorithm=algo, speculative_draft_model_path=str(head),
                  speculative_num_steps=shape[0], speculative_eagle_topk=shape[1],
                  speculative_num_draft_tokens=shape[2], speculative_token_map=hot)
        outs = [o.token_ids for o in llm.chat(msgs, sp)]
        same, match, notes = 0, 0.0, []
        for prompt_msgs, o, v in zip(msgs, outs, vanilla):
            if o == v:
                same += 1
                match += 1
                continue
            i = next(j for j, (a, b) in enumerate(zip(o, v)) if a != b)
            match += i / len(v)
            tok = van_llm.tokenizer
            text = tok.apply_chat_template(prompt_msgs, tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False)  # exactly as LLM.chat tokenizes
            logits = prefill_logits(van_llm.engine, [ids + v[:i]])[0]
            top = logits.topk(2).values
            notes.append(f"{i}: {float(top[0] - top[1]):.3f}")
        print(f"{name:<22} {same:>4}/{len(vanilla):<5} {100 * match / len(vanilla):>12.1f}%  "
              + ", ".join(notes))


if __name__ == "__main__":
    main()
