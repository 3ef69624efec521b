"""`hotspec train-draft --data DIR` on the default target (SmolLM2-135M) on the CPU: token shards
of multi-turn conversations (token_shards.py), the target's features computed per batch.

  * counted_rows over a per-token label mask: the old prompt-length labels where they coincide,
    only the target-written tokens of every assistant turn otherwise;
  * the CLI trains a loadable EAGLE-3 head whose greedy output equals vanilla greedy (float32),
    and reports throughput and the acceptance rate per draft depth;
  * a run halted on a checkpoint and resumed ends with the uninterrupted run's weights; resuming
    with other data, and a folder without shards, are refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open

from hotspec import LLM, SamplingParams
from hotspec.cli.main import main
from hotspec.training.config import TrainConfig, TrainConfigError
from hotspec.training.losses import counted_rows, label_mask, prompt_label_mask
from hotspec.training.online import cut_records, eval_prefix
from hotspec.training.pipeline import run_train_draft
from hotspec.training.token_shards import TokenRecords, save_shard, write_manifest

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

ENGINE = {"num_kv_blocks": 64, "block_size": 16, "max_model_len": 256}
TURNS = [
    ("What is the capital of France?", "The capital of France is Paris.",
     "And of Italy?", "Rome is the capital of Italy."),
    ("Name a prime number.", "Seven is a prime number.", "A larger one?", "Thirteen."),
    ("Write a haiku about rain.", "Soft rain on the roof, a quiet song for the night.",
     "Shorter please.", "Rain sings."),
    ("How many legs does a spider have?", "A spider has eight legs.", "And an ant?", "Six."),
    ("Say hello in Spanish.", "Hola.", "In French?", "Bonjour."),
    ("What is 2 + 2?", "2 + 2 = 4.", "And 3 + 3?", "3 + 3 = 6."),
    ("Give me a colour.", "Blue.", "Another one?", "Green."),
    ("What do bees make?", "Bees make honey.", "From what?", "From the nectar of flowers."),
    ("Is the sun a star?", "Yes, the Sun is a star.", "How old is it?", "About 4.6 billion years."),
    ("Name an ocean.", "The Pacific Ocean.", "The largest?", "The Pacific is the largest."),
]


# ---------------------------------------------------------------- the label mask


def test_counted_rows_prompt_mask_equals_the_prompt_rule() -> None:
    """Labels from n_prompt reproduce q = j + k + 1 < L and q >= n_prompt - 1 exactly; the same
    per-token mask without the token after the record drops only q = L - 1."""
    lengths, n_prompt, t, steps = torch.tensor([9, 4, 13, 3]), torch.tensor([3, 3, 5, 1]), 13, 3
    q = torch.arange(t).view(1, -1) + 1
    old = [((q + k < lengths.view(-1, 1)) & (q + k >= n_prompt.view(-1, 1) - 1)).view(-1).nonzero().view(-1)
           for k in range(steps)]
    new = counted_rows(lengths, prompt_label_mask(lengths, n_prompt, t), t, steps)
    assert [r.tolist() for r in new] == [r.tolist() for r in old]
    mask = torch.arange(t).view(1, -1) >= n_prompt.view(-1, 1)  # 1 on the response tokens
    tail = torch.ones(4, dtype=torch.bool)
    same = counted_rows(lengths, label_mask(lengths, mask, tail), t, steps)
    assert [r.tolist() for r in same] == [r.tolist() for r in old]
    open_end = counted_rows(lengths, label_mask(lengths, mask, ~tail), t, steps)
    for k in range(steps):
        last = {b * t + int(lengths[b]) - k - 2 for b in range(4)}  # j with q = L - 1
        assert set(open_end[k].tolist()) == set(old[k].tolist()) - last


def test_counted_rows_multi_span_mask_counts_only_target_written_labels() -> None:
    spans = [(4, 7), (10, 12)]  # two assistant turns; tokens 7..9 are a user turn
    length, t, steps = 14, 14, 3
    mask = torch.zeros(1, t, dtype=torch.bool)
    for a, b in spans:
        mask[0, a:b] = True
    rows = counted_rows(torch.tensor([length]), label_mask(torch.tensor([length]), mask,
                                                            torch.tensor([False])), t, steps)
    for k in range(steps):
        # q = j + k + 1 in the record, its next token q + 1 in the record and written by the target
        want = [j for j in range(t) if j + k + 2 < length and mask[0, j + k + 2]]
        assert rows[k].tolist() == want
        assert want and all(4 <= j + k + 2 < 7 or 10 <= j + k + 2 < 12 for j in want)


def test_cut_records_keep_the_label_after_the_cut() -> None:
    data = TokenRecords.build([([1, 2, 3, 4, 5, 6], [False, False, False, True, True, True]),
                               ([1, 2, 3], [False, False, False]),
                               ([7, 8, 9, 10], [False, False, False, True])], vocab_size=16)
    cut, stats = cut_records(data, 4)
    assert cut.num_records == 2 and stats == {"cut": 1, "dropped_without_label": 1}
    assert cut.tail.tolist() == [True, False]  # token 4 of the first record is the target's
    assert cut.records.offsets.tolist() == [0, 4, 8]
    assert eval_prefix(*data.record(0)) == [1, 2, 3]


def test_max_answer_tokens_keeps_each_answers_first_tokens_and_ends_the_record_there() -> None:
    F, T = False, True
    data = TokenRecords.build([
        # two answers of 4 and 3 tokens: labels kept on the first 2 of each, cut after the second's
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [F, F, T, T, T, T, F, F, T, T, T, F]),
        ([1, 2, 3, 4], [F, F, F, T]),  # an answer shorter than the cap: unchanged
    ], vocab_size=16)
    cut, stats = cut_records(data, 64, max_answer=2)
    assert cut.num_records == 2 and stats == {"cut": 0, "dropped_without_label": 0}
    assert cut.records.offsets.tolist() == [0, 10, 14]
    assert cut.records.record(0)[1].tolist() == [F, F, T, T, F, F, F, F, T, T]
    assert cut.records.record(0)[0].tolist() == list(range(1, 11))
    assert cut.records.record(1)[1].tolist() == [F, F, F, T]
    assert cut.tail.tolist() == [False, False]
    # the length cap still applies after the answer cap, keeping the label after the cut
    cut, stats = cut_records(data, 3, max_answer=2)
    assert cut.records.offsets.tolist() == [0, 3, 6] and cut.tail.tolist() == [True, True]


def test_max_answer_tokens_needs_data_and_a_positive_count(tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match="--max-answer-tokens"):
        TrainConfig(out=tmp_path, max_answer_tokens=256)
    with pytest.raises(TrainConfigError, match=">= 1"):
        TrainConfig(out=tmp_path, data=tmp_path, max_answer_tokens=0)


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def vanilla() -> LLM:
    return LLM(None, dtype="float32", device="cpu", **ENGINE)


def _conversation(tok: Any, turns: tuple[str, ...]) -> tuple[list[int], list[bool]]:
    """ChatML ids of a two-round conversation; mask 1 on each answer and its <|im_end|>."""
    system = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    ids: list[int] = []
    mask: list[bool] = []

    def add(text: str, written: bool) -> None:
        piece = tok.encode(text, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([written] * len(piece))

    add(system[: system.index("<|im_start|>user")], False)
    for i, text in enumerate(turns):
        role = "assistant" if i % 2 else "user"
        add(f"<|im_start|>{role}\n", False)
        add(text + "<|im_end|>", role == "assistant")
        add("\n", False)
    return ids, mask


def _shards(folder: Path, tok: Any, convs: list[tuple[str, ...]], per_shard: int) -> Path:
    vocab = 49152
    records = [_conversation(tok, c) for c in convs]
    for i in range(0, len(records), per_shard):
        save_shard(folder, i // per_shard, TokenRecords.build(records[i:i + per_shard], vocab))
    write_manifest(folder, vocab)
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train_online")


@pytest.fixture(scope="module")
def data(root: Path, vanilla: LLM) -> Path:
    return _shards(root / "tokens", vanilla.tokenizer, TURNS, per_shard=6)


SMALL: dict[str, Any] = dict(arch="eagle3", draft_vocab=256, eval_prompts=2, max_seq_len=64,
                             max_new_tokens=12, epochs=2, lr=1e-3, batch_size=2, ttt_steps=2,
                             save_every=2, eval_num_steps=2, dtype="float32", device="cpu",
                             progress=False, engine_kwargs=ENGINE)


def _config(out: Path, data: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(out=out, data=data, **{**SMALL, **kw})


@pytest.fixture(scope="module")
def full(root: Path, data: Path) -> dict[str, Any]:
    """The CLI, uninterrupted."""
    out = root / "full"
    rc = main(["train-draft", "--data", str(data), "--out", str(out), "--draft-vocab", "256",
               "--eval-prompts", "2", "--max-seq-len", "64", "--max-new-tokens", "12",
               "--epochs", "2", "--lr", "1e-3", "--batch-size", "2", "--ttt-steps", "2",
               "--save-every", "2", "--device", "cpu", "--dtype", "float32",
               "--kv-cache-memory-gb", "0.01", "--no-progress"])
    assert rc == 0
    return json.loads((out / "train_report.json").read_text())


def test_report(full: dict[str, Any]) -> None:
    d = full["data"]
    assert d["records"] == 10 and d["train_records"] == 8 and d["eval_prompts"] == 2
    assert d["response_tokens"] > d["train_labels"] > 0 and d["dropped_without_label"] == 0
    assert full["prompts"] == {"source": "data", "eval_prompts_from": "held-back records",
                               "eval_prompts_file": None, "held_back": 2}
    t = full["training"]
    assert t["features"] == "online (per batch)" and t["steps"] == 2 * 4 and t["ttt_steps"] == 2
    speed = t["throughput"]
    assert speed["steps"] == 8 and speed["wall_s"] > 0
    assert speed["label_positions_per_s"] > 0 and speed["record_tokens_per_s"] > 0
    assert 0 < speed["label_positions"] < speed["record_tokens"]
    tau = full["tau"]
    assert tau["prompts_from"] == "held-back records" and len(tau["per_prompt"]) == 2
    depth = tau["acceptance_by_depth"]
    assert depth[0]["depth"] == 1 and depth[0]["reached"] > 0 and 0 <= depth[0]["rate"] <= 1


def test_head_is_lossless_in_the_engine(full: dict[str, Any], root: Path, data: Path,
                                        vanilla: LLM) -> None:
    tok = vanilla.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c[0]}], tokenize=False,
                                              add_generation_prompt=True), add_special_tokens=False)
           for c in TURNS[:3]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in vanilla.generate(prompt_token_ids=ids, sampling_params=params)]
    spec = LLM(None, dtype="float32", device="cpu", **ENGINE, speculative_algorithm="EAGLE3",
               speculative_draft_model_path=str(root / "full"), speculative_num_steps=2,
               speculative_eagle_topk=1, speculative_num_draft_tokens=3)
    assert spec.engine.draft.draft_vocab_size == 256
    got = spec.generate(prompt_token_ids=ids, sampling_params=params)
    assert [o.token_ids for o in got] == want


def test_resume_continues_exactly(full: dict[str, Any], root: Path, data: Path) -> None:
    out = root / "resumed"
    assert run_train_draft(_config(out, data, halt_after=4)) == {"halted": 4}
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 4 and ckpt["meta"]["data"]["records"] == 10
    state = ckpt["optimizer"]["state"].values()
    assert all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in state)
    assert all(v.dtype == torch.float32 for v in ckpt["trainable"].values())
    with pytest.raises(TrainConfigError, match="--resume"):
        run_train_draft(_config(out, data))  # a used --out needs --resume
    resumed = run_train_draft(_config(out, data, resume=True))
    assert resumed["training"]["loss"][:4] == ckpt["history"]["loss"]
    assert resumed["training"]["loss"] == full["training"]["loss"]
    assert resumed["training"]["throughput"]["steps"] == 4  # this process trained the rest
    with safe_open(root / "full" / "model.safetensors", "pt") as a, \
            safe_open(out / "model.safetensors", "pt") as b:
        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k


def test_resume_with_other_data_is_refused(full: dict[str, Any], root: Path, vanilla: LLM) -> None:
    other = _shards(root / "other_tokens", vanilla.tokenizer, TURNS[:8], per_shard=8)
    with pytest.raises(TrainConfigError, match="trained on other data"):
        run_train_draft(_config(root / "full", other, resume=True))


def test_folder_without_shards(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = root / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no token shards"):
        run_train_draft(_config(root / "x", empty))
    rc = main(["train-draft", "--data", str(root / "missing"), "--out", str(root / "y"),
               "--device", "cpu", "--no-progress"])
    assert rc == 2 and "no such folder" in capsys.readouterr().err


def test_data_excludes_generation_options(root: Path, data: Path) -> None:
    with pytest.raises(TrainConfigError, match="--prompts"):
        _config(root / "x", data, prompts=(root / "p.txt",))
    with pytest.raises(TrainConfigError, match="goes with --data"):
        TrainConfig(out=root / "x", eval_prompts_file=root / "p.txt")


def test_token_shards_round_trip(data: Path) -> None:
    from hotspec.training.token_shards import load_records

    records = load_records(data)
    assert records.num_records == 10 and records.tokens.dtype == np.uint16
    ids, mask = records.record(0)
    prefix = eval_prefix(ids, mask)
    assert mask.any() and 0 < len(prefix) < len(ids) and not mask[: len(prefix)].any()


def test_online_features_are_the_recorded_ones(data: Path, vanilla: LLM) -> None:
    """A batch's features are extract_features' (the recorded mode's) for the same records, bit
    for bit, with each record's own labels."""
    from hotspec.training.features import extract_features
    from hotspec.training.head_init import aux_layers, head_config
    from hotspec.training.online import OnlineData
    from hotspec.training.token_shards import load_records

    engine = vanilla.engine
    tcfg = engine.model_config
    aux = aux_layers(head_config(tcfg, "EAGLE3", 256, None), tcfg, "EAGLE3")
    records, _ = cut_records(load_records(data), 64)
    block = OnlineData(engine, records, aux, 4096).block([3, 0])
    ids = [records.records.record(r)[0].tolist() for r in (3, 0)]
    ref = extract_features(engine, ids, [0, 0], aux, 4096)
    assert block.tokens.tolist() == ref.tokens.tolist()
    assert ref.final is not None and block.final is not None
    assert torch.equal(block.feature, ref.feature) and torch.equal(block.final, ref.final)
    assert torch.equal(block.argmax, ref.argmax)
    assert block.mask is not None and block.tail is not None
    assert block.mask.tolist() == [bool(m) for r in (3, 0) for m in records.records.record(r)[1]]
    assert block.tail.tolist() == records.tail[[3, 0]].tolist()


def test_time_limit_saves_and_stops(root: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--time-limit: the step that passes it is saved and the run stops, for --resume to go on."""
    out = root / "timed"
    rc = main(["train-draft", "--data", str(data), "--out", str(out), "--draft-vocab", "256",
               "--eval-prompts", "2", "--max-seq-len", "64", "--batch-size", "2", "--ttt-steps", "2",
               "--device", "cpu", "--dtype", "float32", "--kv-cache-memory-gb", "0.01",
               "--time-limit", "1e-6", "--no-progress"])
    assert rc == 0 and "stopped at step 1 (--time-limit)" in capsys.readouterr().out
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["step"] == 1
    with pytest.raises(TrainConfigError, match="--time-limit must be > 0"):
        _config(out, data, time_limit=0)
