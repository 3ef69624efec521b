"""The engine without Triton (the CPU torch wheel ships none): a vanilla and an EAGLE-3 greedy
generate of a tiny random model on the CPU, in a process where `import triton` fails, give the
same tokens, and no Triton kernel module is imported on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from engine_utils import save_tiny_llama

from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys
sys.modules["triton"] = None  # `import triton` raises ImportError from here on
from hotspec import LLM, SamplingParams

target, head = sys.argv[1], sys.argv[2]
params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
prompts = [[1, 5, 9, 33, 2], list(range(10, 40))]
kw = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=2)
vanilla = LLM(target, **kw).generate(prompt_token_ids=prompts, sampling_params=params)
spec = LLM(target, speculative_algorithm="EAGLE3", speculative_draft_model_path=head,
           speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=4,
           **kw).generate(prompt_token_ids=prompts, sampling_params=params)
print(json.dumps({"vanilla": [o.token_ids for o in vanilla], "spec": [o.token_ids for o in spec],
                  "spec_steps": [o.stats.spec_steps for o in spec],
                  "kernels": sorted(m for m in sys.modules if m.startswith("hotspec")
                                    and m.endswith(("_kernel", "_kernels", ".pdl")))}))
"""


def test_vanilla_and_eagle3_generate_without_triton(tmp_path):
    target = save_tiny_llama(tmp_path / "target", vocab=128, hidden=64, layers=4, std=0.2)
    cfg, _ = load_checkpoint(target, torch.float32)
    head = random_draft_checkpoint(tmp_path / "head", cfg, "EAGLE3", seed=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", CHILD, str(target), str(head)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["spec"] == got["vanilla"]
    assert all(len(t) == 8 for t in got["vanilla"])
    assert all(n > 0 for n in got["spec_steps"]), "the speculative path ran"
    assert got["kernels"] == []
