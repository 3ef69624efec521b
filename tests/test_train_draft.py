"""`hotspec train-draft` on a tiny target (chat_target.py: 64-token character vocabulary with a
chat template, whose greedy continuations a head learns in a few hundred CPU steps).

  * EAGLE-3 is trained through the Python API on prompts the target synthesizes itself, with a
    40-token draft vocabulary (d2t / t2d) and 3 TTT steps; EAGLE-1/2 through the CLI on a
    truncated ShareGPT file (single-step loss, the default), with an FR-Spec map written next to it.
  * Both: files in the public format (same keys and shapes as draft_checkpoint writes), the loss
    falls, greedy decoding with the head equals vanilla greedy, tau > 1.5 on held-back prompts,
    and the training forward equals the engine's draft forward at every TTT step (1e-4).
  * --resume: a run halted mid-way and resumed ends with exactly the weights of an uninterrupted
    run (step counter, optimizer and schedule state restored).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_target import save_chat_target
from safetensors import safe_open

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.core.request import Request
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.draft_loader import load_draft_head
from hotspec.models.eagle import EagleHead
from hotspec.models.eagle3 import Eagle3Head
from hotspec.models.loader import load_checkpoint
from hotspec.runtime.batch_builder import block_table_tensor, last_token_index, prefill_batch
from hotspec.speculative.io import DraftIn
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.data import load_dataset
from hotspec.training.head_forward import unroll
from hotspec.training.pipeline import run_train_draft
from hotspec.training.prompt_files import read_prompts
from hotspec.training.prompts import synthesize_prompts

ENGINE = {"num_kv_blocks": 256, "block_size": 16, "max_model_len": 256}
TTT = 3


@dataclass
class Run:
    out: Path
    report: dict[str, Any]
    algorithm: str


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train_draft")


@pytest.fixture(scope="module")
def target(root: Path) -> Path:
    return save_chat_target(root / "target")


@pytest.fixture(scope="module")
def sharegpt(root: Path) -> Path:
    """40 conversations (system, human, gpt turns) as a JSON array cut off inside the last one."""
    rng = random.Random(1)
    convs = []
    for i in range(41):
        text = "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(8, 30)))
        convs.append({"id": str(i), "conversations": [
            {"from": "system", "value": "be brief"}, {"from": "human", "value": text},
            {"from": "gpt", "value": "an answer the target will regenerate"}]})
    text = json.dumps(convs)
    path = root / "sharegpt.json"
    path.write_text(text[: text.rindex('{"id"') + 25])
    return path


def _config(target: Path, out: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(out=out, model=str(target), num_prompts=40, eval_prompts=4,
                                max_new_tokens=32, epochs=8, lr=3e-3, batch_size=4, ttt_steps=TTT,
                                save_every=1000, dtype="float32", device="cpu", progress=False,
                                engine_kwargs=ENGINE)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def runs(target: Path, sharegpt: Path, root: Path) -> dict[str, Run]:
    """One EAGLE-3 run (API, synthesized prompts) and one EAGLE run (CLI, ShareGPT prompts)."""
    e3 = root / "eagle3"
    report3 = run_train_draft(_config(target, e3, arch="eagle3", draft_vocab=40))
    e1 = root / "eagle"
    rc = main(["train-draft", "--model", str(target), "--out", str(e1), "--arch", "eagle",
               "--draft-vocab", "48", "--prompts", str(sharegpt), "--num-prompts", "40",
               "--eval-prompts", "4", "--max-new-tokens", "32", "--epochs", "8", "--lr", "3e-3",
               "--batch-size", "4", "--device", "cpu", "--dtype", "float32",
               "--kv-cache-memory-gb", "0.01", "--no-progress"])
    assert rc == 0
    report1 = json.loads((e1 / "train_report.json").read_text())
    return {"eagle3": Run(e3, report3, "EAGLE3"), "eagle": Run(e1, report1, "EAGLE")}


ARCHS = ["eagle3", "eagle"]


def _llm(target: Path, run: Run | None, steps: int = 3, topk: int = 1) -> LLM:
    spec: dict[str, Any] = {}
    if run is not None:
        ntok = steps + 1 if topk == 1 else 8
        spec = dict(speculative_algorithm=run.algorithm, speculative_draft_model_path=str(run.out),
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=ntok)
    return LLM(str(target), dtype="float32", device="cpu", **ENGINE, **spec)


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("arch", ARCHS)
def test_outputs_in_public_format(arch: str, runs: dict[str, Run], target: Path, root: Path) -> None:
    run = runs[arch]
    for name in ("config.json", "model.safetensors", "train_report.json", "loss.png"):
        assert (run.out / name).is_file(), name
    # Exactly the keys and shapes draft_checkpoint writes for a public head of this target.
    tcfg = load_checkpoint(target, torch.float32)[0]
    config = json.loads((run.out / "config.json").read_text())
    ref = random_draft_checkpoint(root / f"ref_{arch}", tcfg, run.algorithm,
                                  draft_vocab_size=40 if arch == "eagle3" else None,
                                  extra_config={k: config[k] for k in ("eagle_config",) if k in config})
    assert config["architectures"] == json.loads((ref / "config.json").read_text())["architectures"]
    assert _shapes(run.out) == _shapes(ref)
    r = run.report
    assert r["device"] == "cpu" and r["algorithm"] == run.algorithm
    assert r["data"]["records"] >= 30 and r["data"]["response_tokens"] > 500
    assert len(r["training"]["loss"]) == r["training"]["steps"] == 8 * -(-r["data"]["records"] // 4)
    ttt = TTT if arch == "eagle3" else 1  # EAGLE-1/2 defaults to the paper's single step
    assert r["training"]["ttt_steps"] == ttt and all(len(s) == ttt for s in r["training"]["step_loss"])
    assert r["prompts"]["held_back"] == 4 and r["tau"]["prompts_from"] == "held-back"
    split = json.loads((run.out / "data" / "prompts.json").read_text())
    assert len(split["train"]) + len(split["eval"]) == 40
    for p in split["train"] + split["eval"]:  # one user turn, then the generation prompt
        assert p["text"] and p["ids"][0] == 3 and p["ids"][-2:] == [2, 4] and len(p["ids"]) > 3
    if arch == "eagle":
        assert r["prompts"]["source"] == "files" and r["command"].startswith("hotspec train-draft")
        hot = torch.load(run.out / "freq_48.pt", weights_only=True)
        assert isinstance(hot, list) and len(hot) == len(set(hot)) == 48 and 2 in hot  # EOS kept
        assert r["draft_vocab"]["coverage"] > 0.9
    else:
        assert r["prompts"]["source"] == "synthesized"
        head = load_draft_head(run.out, _llm(target, None).engine.target, "EAGLE3", torch.float32, "cpu")
        assert head.draft_vocab_size == 40 and 2 in head.to_target_ids(torch.arange(40)).tolist()


def _shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_decreases(arch: str, runs: dict[str, Run]) -> None:
    t = runs[arch].report["training"]
    first, last = t["loss"][:5], t["loss"][-10:]
    assert sum(last) / len(last) < 0.5 * sum(first) / len(first)
    assert t["step_acc"][-1][0] > 0.5  # the head's top-1 agrees with the target's most of the time


@pytest.mark.parametrize("arch", ARCHS)
def test_trained_head_accepts(arch: str, runs: dict[str, Run]) -> None:
    tau = runs[arch].report["tau"]
    assert tau["mean"] > 1.5, tau
    assert sum(v for k, v in tau["accept_hist"].items() if int(k) > 1) > 0  # drafts accepted


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", [(3, 1), (3, 4)], ids=["chain", "tree"])
def test_lossless_in_engine(arch: str, shape: tuple[int, int], runs: dict[str, Run],
                            target: Path) -> None:
    run = runs[arch]
    prompts = json.loads((run.out / "data" / "prompts.json").read_text())["eval"]
    ids = [p["ids"] for p in prompts] + [[3] + [9 + i % 40 for i in range(n)] + [2, 4] for n in (5, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    vanilla = [o.token_ids for o in _llm(target, None).generate(prompt_token_ids=ids, sampling_params=params)]
    spec_llm = _llm(target, run, *shape)
    outs = spec_llm.generate(prompt_token_ids=ids, sampling_params=params)
    assert [o.token_ids for o in outs] == vanilla
    assert sum(o.stats.generated_tokens for o in outs) > 1.3 * sum(o.stats.spec_steps + 1 for o in outs)


# ---------------------------------------------------------------- training forward == engine


@pytest.mark.parametrize("fused_kernels", [False, True], ids=["torch", "fused"])
@pytest.mark.parametrize("arch", ARCHS)
def test_training_forward_matches_engine(arch: str, fused_kernels: bool, runs: dict[str, Run],
                                         target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 0 at every prompt position (the engine's draft prefill) and steps 1..K-1 of the chain
    rooted at the last position (the engine's draft phase) give the training forward's logits.
    `fused`: the engine runs the CUDA path's fused kernels (Triton interpreter on the CPU), as on
    the GPU, while training runs the torch code: a head trained on the GPU drafts what it learned."""
    from hotspec.layers import fused

    llm = _llm(target, runs[arch], steps=TTT, topk=1)
    engine, worker = llm.engine, llm.engine.worker
    head = engine.draft
    assert isinstance(head, Eagle3Head if arch == "eagle3" else EagleHead)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 64, (n,), generator=g).tolist() for n in (7, 19, 12)]
    reqs = [Request(-1 - i, p, SamplingParams(temperature=0.0), 0) for i, p in enumerate(prompts)]
    for r in reqs:
        r.blocks = engine.allocator.allocate(-(-(len(r.prompt_token_ids) + worker.reserve) // 16))
    phases = worker.phases
    monkeypatch.setattr(phases, "max_kv", max(map(len, prompts)) + worker.reserve)  # as step() does
    captured: list[torch.Tensor] = []
    topk = phases.draft_topk

    def capture(h: torch.Tensor, k: int, process: object = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = topk(h, k, process)  # type: ignore[arg-type]
        captured.append(out[2])
        return out

    if fused_kernels:
        monkeypatch.setattr(fused, "_on_device", lambda x: True)
    try:
        with torch.inference_mode():
            fb = prefill_batch(reqs, prompts, engine.block_size, engine.device)
            hidden, aux = phases.target_runner.forward(fb)
            last = last_token_index(fb)
            roots = engine.target.compute_logits(hidden[last]).argmax(-1)
            features = torch.cat(aux, -1) if aux else hidden
            shifted = [p[1:] + [int(t)] for p, t in zip(prompts, roots)]
            dfb = prefill_batch(reqs, shifted, engine.block_size, engine.device)
            dfb.hidden_in = features
            h_logits, h_feat = phases.draft_runner.forward(dfb)
            step0 = head.compute_logits(h_logits)
            for r, p in zip(reqs, prompts):
                r.seq_len = len(p)
            logp, ids, _ = phases.draft_topk(h_logits[last], 1)
            monkeypatch.setattr(phases, "draft_topk", capture)
            phases.draft_tree(DraftIn(seq=torch.tensor([len(p) for p in prompts]),
                                      tables=block_table_tensor(reqs, engine.device), root=roots,
                                      topk_logp=logp, topk_ids=ids, feature=h_feat[last]))
    finally:
        for r in reqs:
            engine.allocator.free(r.blocks)
        monkeypatch.setattr(fused, "_on_device", lambda x: x.is_cuda)  # training: the torch code
    assert len(captured) == TTT - 1
    # The chain the engine drafted: root, then each step's top-1 (target ids).
    chain = [roots, ids[:, 0]] + [head.to_target_ids(c.argmax(-1)) for c in captured[:-1]]
    seqs = [p + [int(c[b]) for c in chain] for b, p in enumerate(prompts)]
    t = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    feats = torch.zeros(len(seqs), t, features.shape[1])
    for b, (s, p) in enumerate(zip(seqs, prompts)):
        tokens[b, :len(s)] = torch.tensor(s)
        start = int(fb.cu_seqlens_q[b])
        feats[b, :len(p)] = features[start:start + len(p)]
    with torch.no_grad():
        outs = [head.compute_logits(h) for h, _ in unroll(head, tokens, feats, TTT)]
    for b, p in enumerate(prompts):
        start, n = int(fb.cu_seqlens_q[b]), len(p)
        torch.testing.assert_close(outs[0][b, :n], step0[start:start + n], atol=1e-4, rtol=0)
        for k in range(1, TTT):
            torch.testing.assert_close(outs[k][b, n - 1], captured[k - 1][b], atol=1e-4, rtol=0)


# ---------------------------------------------------------------- resume


def test_resume_continues_exactly(target: Path, root: Path) -> None:
    """Halted on a checkpoint of the save_every schedule (where the uninterrupted run rounds its
    AdamW moments to bfloat16 too), the resumed run ends with the same weights."""
    small = dict(arch="eagle3", draft_vocab=40, num_prompts=12, eval_prompts=2, max_new_tokens=16,
                 epochs=3, save_every=4)
    full = run_train_draft(_config(target, root / "full", **small))
    total = full["training"]["steps"]
    assert total == 3 * -(-full["data"]["records"] // 4) > 6  # 3 epochs of batches of 4
    out = root / "resumed"
    out.mkdir()
    shutil.copytree(root / "full" / "data", out / "data")  # same prompts and features
    assert run_train_draft(_config(target, out, resume=True, halt_after=4, **small)) == {"halted": 4}
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 4 and len(ckpt["history"]["loss"]) == 4
    assert all(int(s["step"]) == 4 for s in ckpt["optimizer"]["state"].values())
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in ckpt["optimizer"]["state"].values())
    assert not (out / "model.safetensors").exists()
    resumed = run_train_draft(_config(target, out, resume=True, **small))
    assert resumed["training"]["steps"] == total
    assert resumed["training"]["loss"][:4] == ckpt["history"]["loss"]  # continued, not restarted
    assert resumed["training"]["loss"] == full["training"]["loss"]
    with safe_open(root / "full" / "model.safetensors", "pt") as a, \
            safe_open(out / "model.safetensors", "pt") as b:
        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k


def test_refuses_a_used_out_dir_without_resume(target: Path, runs: dict[str, Run]) -> None:
    with pytest.raises(ValueError, match="--resume"):
        run_train_draft(_config(target, runs["eagle3"].out, arch="eagle3"))


# ---------------------------------------------------------------- prompts


def test_synthesized_prompts_without_tokenizer(target: Path) -> None:
    llm = LLM(str(target), dtype="float32", device="cpu", skip_tokenizer_init=True, **ENGINE)
    prompts = synthesize_prompts(llm, 6, seed=0)
    assert len(prompts) == 6 and len({tuple(p.ids) for p in prompts}) == 6
    assert all(p.text is None and len(p.ids) > 1 and 2 not in p.ids for p in prompts)  # EOS cut
    assert [p.ids for p in synthesize_prompts(llm, 6, seed=0)] == [p.ids for p in prompts]


def test_prompt_files(tmp_path: Path, sharegpt: Path) -> None:
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\nfirst prompt\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join([
        json.dumps({"messages": [{"role": "system", "content": "s"},
                                 {"role": "user", "content": [{"type": "text", "text": "parts"}]},
                                 {"role": "user", "content": "second user turn"}]}),
        "{not json",
        json.dumps({"conversations": [{"from": "gpt", "value": "no human turn"}]}),
        json.dumps({"prompt": "a plain prompt"})]) + "\n")
    assert read_prompts([txt]) == ["first prompt", "second prompt"]
    assert read_prompts([jsonl]) == ["parts", "a plain prompt"]
    from_json = read_prompts([sharegpt])
    assert len(from_json) == 40  # the 41st conversation is cut off
    assert "be brief" not in from_json and "an answer" not in " ".join(from_json)
    assert read_prompts([txt, jsonl], limit=3) == ["first prompt", "second prompt", "parts"]
    with pytest.raises(FileNotFoundError):
        read_prompts([tmp_path / "missing.txt"])


def test_synth_prompts_and_several_responses_per_prompt(target: Path, sharegpt: Path, root: Path) -> None:
    """--synth-prompts adds target-sampled prompts to the files' ones; --responses-per-prompt R
    draws R differently seeded responses per prompt (R records each)."""
    out = root / "more_data"
    cfg = _config(target, out, prompts=(sharegpt,), num_prompts=6, eval_prompts=0, synth_prompts=4,
                  responses_per_prompt=2, response_temperature=0.9, epochs=1, halt_after=1)
    assert run_train_draft(cfg) == {"halted": 1}
    split = json.loads((out / "data" / "prompts.json").read_text())
    assert split["source"] == "files+synthesized" and len(split["train"]) == 10
    records = load_dataset(out / "data")
    assert records.num_records == 20
    first, second = (records.tokens[records.offsets[i]:records.offsets[i + 1]].tolist() for i in (0, 1))
    n = int(records.n_prompt[0])
    assert first[:n] == second[:n] and first != second  # one prompt, two sampled answers


def test_more_data_options_are_checked(target: Path, sharegpt: Path, root: Path) -> None:
    with pytest.raises(TrainConfigError, match="--temperature > 0"):
        _config(target, root / "x", responses_per_prompt=3)
    with pytest.raises(TrainConfigError, match="adds sampled prompts to --prompts files"):
        _config(target, root / "x", synth_prompts=5)
