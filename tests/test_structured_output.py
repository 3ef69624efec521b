"""Structured output (SamplingParams.grammar, through xgrammar): every answer matches its grammar
(JSON that parses and validates against its schema, a regex's full match), and speculative
decoding (chain and tree, the shipped hot-vocabulary head, a full-vocabulary head with an
FR-Spec map) gives vanilla's tokens exactly, each tree node masked by the grammar after its
path. The draft proposes under the grammar too. Sampling's exactness with a grammar is
tests/test_spec_stochastic.py's."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hotspec import LLM, SamplingParams
from hotspec.errors import InvalidRequestError
from hotspec.models.default_model import default_model_path
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.sampling_params import GrammarSpec

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]},
                                  "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
REGEX = r"(yes|no), because [a-z ]{1,24}\."
ASKS = ["Give me a JSON record for a person called Bob.", "Describe a cat as JSON.",
        "Is Paris in France? Answer yes or no and why."]
GRAMMARS = {"json_schema": GrammarSpec("json_schema", json.dumps(SCHEMA)),
            "regex": GrammarSpec("regex", REGEX), "json_object": GrammarSpec("json_object")}
N = 64


def params(kind: str, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=N, grammar=GRAMMARS[kind], **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def prompts(smol_llm: LLM) -> list[list[int]]:
    tok = smol_llm.engine.tokenizer
    out = [tok.apply_chat_template([{"role": "user", "content": a}], add_generation_prompt=True)
           for a in ASKS]
    return [p if isinstance(p, list) else p["input_ids"] for p in out]


@pytest.fixture(scope="module")
def vanilla(smol_llm: LLM, prompts: list[list[int]]) -> dict[str, list]:
    return {k: smol_llm.generate(prompt_token_ids=prompts, sampling_params=params(k)) for k in GRAMMARS}


def valid(value: object) -> bool:
    """`value` satisfies SCHEMA (checked by hand: the keys, types and bounds it names)."""
    return (isinstance(value, dict) and set(value) == {"name", "age", "pets"}
            and isinstance(value["name"], str) and len(value["name"]) <= 12
            and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and isinstance(value["pets"], list) and len(value["pets"]) <= 3
            and all(p in ("cat", "dog", "fish") for p in value["pets"]))


def test_vanilla_answers_match_their_grammar(vanilla) -> None:
    for o in vanilla["json_schema"]:
        assert o.finish_reason == "stop", o.text  # the grammar completes within N tokens
        assert valid(json.loads(o.text)), o.text
    for o in vanilla["regex"]:
        assert o.finish_reason == "stop" and re.fullmatch(REGEX, o.text), o.text
    for o in vanilla["json_object"]:  # (may run out of tokens: then a prefix of an object)
        assert o.text.lstrip().startswith("{")
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict)


def test_unconstrained_answers_differ(smol_llm, prompts, vanilla) -> None:
    free = smol_llm.generate(prompt_token_ids=prompts,
                             sampling_params=SamplingParams(temperature=0.0, max_tokens=N))
    assert [o.token_ids for o in free] != [o.token_ids for o in vanilla["json_schema"]]


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_speculative_greedy_with_a_grammar_equals_vanilla(kind, spec, prompts, vanilla) -> None:
    outs = spec.generate(prompt_token_ids=prompts, sampling_params=params(kind))
    assert [o.token_ids for o in outs] == [o.token_ids for o in vanilla[kind]]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in vanilla[kind]]
    assert sum(o.stats.spec_steps for o in outs) < sum(len(o.token_ids) for o in outs)


def test_grammar_beside_penalties_logprobs_and_free_requests(spec, smol_llm, prompts) -> None:
    """One batch: a constrained request with penalties and logprobs, and a free one."""
    mixed = [params("json_schema", presence_penalty=0.5, logprobs=2),
             SamplingParams(temperature=0.0, max_tokens=N)]
    want = smol_llm.generate(prompt_token_ids=prompts[:2], sampling_params=mixed)
    got = spec.generate(prompt_token_ids=prompts[:2], sampling_params=mixed)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert valid(json.loads(got[0].text))
    assert got[0].logprobs is not None and want[0].logprobs is not None
    assert [t.logprob for t in got[0].logprobs] == pytest.approx(
        [t.logprob for t in want[0].logprobs], abs=1e-4)


def test_full_vocabulary_head_with_a_map_equals_vanilla(vanilla, prompts, tmp_path) -> None:
    cfg = load_checkpoint(default_model_path(), torch.float32)[0]
    head = random_draft_checkpoint(tmp_path / "eagle", cfg, "EAGLE", seed=3)
    torch.save(list(range(0, 49152, 3)), tmp_path / "hot.pt")
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE",
              speculative_draft_model_path=str(head), speculative_num_steps=3,
              speculative_eagle_topk=2, speculative_num_draft_tokens=5,
              speculative_token_map=str(tmp_path / "hot.pt"))
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params("json_schema"))
    assert [o.token_ids for o in outs] == [o.token_ids for o in vanilla["json_schema"]]


def test_adaptive_engine_with_a_grammar_equals_vanilla(prompts, vanilla) -> None:
    llm = LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3")
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params("regex"))
    assert [o.token_ids for o in outs] == [o.token_ids for o in vanilla["regex"]]


def test_the_draft_proposes_under_the_grammar(spec, prompts, monkeypatch) -> None:
    """The draft's next candidates are masked by the grammar after the accepted tokens: more
    tokens per step than unmasked proposals, same answer."""
    from hotspec.runtime.logits_state import LogitsState

    outs = spec.generate(prompt_token_ids=prompts, sampling_params=params("json_schema"))
    with monkeypatch.context() as m:
        m.setattr(LogitsState, "mask_columns", lambda self, logits, slot, columns: logits)
        raw = spec.generate(prompt_token_ids=prompts, sampling_params=params("json_schema"))
    assert [o.token_ids for o in outs] == [o.token_ids for o in raw]
    steps, raw_steps = (sum(o.stats.spec_steps for o in x) for x in (outs, raw))
    print("steps with the draft masked", steps, "unmasked", raw_steps)
    assert steps < raw_steps


@pytest.mark.parametrize("spec_kind,msg", [
    (GrammarSpec("json_schema", '{"type": 5}', field="response_format"),
     "response_format: invalid json schema: .*string"),
    (GrammarSpec("regex", "[a-", field="guided_regex"), "guided_regex: invalid regex: .*Unclosed"),
    (GrammarSpec("ebnf", "root ::= ", field="guided_grammar"), "guided_grammar: invalid ebnf"),
])
def test_a_bad_grammar_is_refused_and_nothing_else_changes(spec_kind, msg, smol_llm, prompts) -> None:
    with pytest.raises(InvalidRequestError, match=msg):
        smol_llm.generate(prompt_token_ids=prompts[:1],
                          sampling_params=SamplingParams(max_tokens=4, grammar=spec_kind))
    assert not smol_llm.engine.has_unfinished()
    out = smol_llm.generate(prompt_token_ids=prompts[:1], sampling_params=params("regex"))[0]
    assert re.fullmatch(REGEX, out.text)


def test_grammar_spec_is_checked() -> None:
    with pytest.raises(InvalidRequestError, match="grammar kind must be one of"):
        GrammarSpec("yaml", "x")
    with pytest.raises(InvalidRequestError, match="a regex grammar needs its text"):
        GrammarSpec("regex", "")
    with pytest.raises(InvalidRequestError, match="grammar must be a GrammarSpec"):
        SamplingParams(grammar="json")  # type: ignore[arg-type]


@pytest.mark.parametrize("spec_shape", [None, (3, 1, 4), (4, 8, 12)], ids=["vanilla", "chain", "tree"])
def test_overlap_schedule_and_static_graphs_keep_the_tokens(spec_shape, prompts, vanilla,
                                                            monkeypatch) -> None:
    """A constrained request is read before its next launch (its matcher reads each token
    first) while free requests beside it overlap as before; through the static-graph path (the
    CUDA-graph buffers, on the CPU) the tokens are the plain schedule's."""
    from hotspec.engine.builder import EngineBuilder
    from hotspec.runtime.graph_runner import GraphRunner

    monkeypatch.setattr(EngineBuilder, "_graph_runner",
                        lambda self: GraphRunner(self.device, "static", [1, 2, 4]))
    kw: dict = dict(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, overlap_schedule=True,
                    max_model_len=256)  # (static graphs attend over the whole context)
    if spec_shape is not None:
        kw.update(speculative_algorithm="EAGLE3", speculative_num_steps=spec_shape[0],
                  speculative_eagle_topk=spec_shape[1], speculative_num_draft_tokens=spec_shape[2])
    llm = LLM(**kw)
    free = SamplingParams(temperature=0.0, max_tokens=N)
    mixed = [free, params("json_schema"), free, params("regex")]
    batch = [prompts[0], prompts[0], prompts[1], prompts[2]]
    outs = llm.generate(prompt_token_ids=batch, sampling_params=mixed)
    assert outs[1].token_ids == vanilla["json_schema"][0].token_ids
    assert outs[3].token_ids == vanilla["regex"][2].token_ids
    alone = LLM(**dict(kw, overlap_schedule=False)).generate(prompt_token_ids=batch, sampling_params=mixed)
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    assert not llm.engine.worker.unread() and not llm.engine.has_unfinished()


def test_tree_masks_follow_each_path_and_leave_off_grammar_nodes_unmasked(smol_llm) -> None:
    """RequestGrammar.fill_tree: row i is the mask after node i's path; a node whose path leaves
    the grammar (and every node under it) keeps an all-zero row, which LogitsState.process reads
    as no mask (that node is never accepted; a row that allows nothing would only give NaNs)."""
    from hotspec.runtime.grammar import GrammarCompiler, bitmask_width
    from hotspec.runtime.logits_state import LogitsState

    tok = smol_llm.engine.tokenizer
    vocab = smol_llm.engine.model_config.vocab_size
    g = GrammarCompiler(tok, vocab).matcher(GrammarSpec("regex", "(yes|no)!"))
    yes, no, bang = (tok.encode(s, add_special_tokens=False)[0] for s in ("yes", "no", "!"))
    # node 0 the root; 1 "yes" under it, 2 "!" under 1 (on the grammar); 3 "!" under the root
    # (off it), 4 "no" under 3 (under an off-grammar node)
    tokens = torch.tensor([0, yes, bang, bang, no])
    parents = torch.tensor([-1, 0, 1, 0, 3])
    rows = torch.zeros(5, bitmask_width(vocab), dtype=torch.int32)
    g.fill_tree(tokens, parents, rows)

    def allowed(row: int) -> set[int]:
        bits = (rows[row].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        return set(torch.nonzero(bits.view(-1)[:vocab]).view(-1).tolist())

    assert yes in allowed(0) and no in allowed(0) and bang not in allowed(0)
    assert allowed(1) == {bang}
    assert tok.eos_token_id in allowed(2)  # the grammar is complete after "yes!"
    assert allowed(3) == set() and allowed(4) == set()
    state = LogitsState(rows=2, vocab=vocab, nodes=5, device=torch.device("cpu"))
    state.grammar[0] = rows
    logits = torch.zeros(5, vocab)
    zeros = torch.zeros(5)
    out = state.process(logits, torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                        torch.zeros(5, dtype=torch.long), zeros, zeros, torch.ones(5),
                        node=torch.arange(5))
    assert torch.isfinite(out[1]).sum() == 1 and torch.isfinite(out[1, bang])
    assert torch.isfinite(out[3]).all() and torch.isfinite(out[4]).all()  # off the grammar: unmasked


def test_a_serving_loop_never_waits_for_a_grammar_to_compile(smol_llm, prompts, monkeypatch) -> None:
    """With wait_grammar=False (the serving loop's add_request) a grammar compiles on the
    engine's grammar thread: a free request beside it keeps decoding meanwhile, the constrained
    request then runs and gives the tokens it gives when compiled up front; a grammar that fails
    to compile there finishes its request with "error" and its message, and nothing else."""
    import threading
    import time

    from hotspec.runtime.grammar import GrammarCompiler

    engine = smol_llm.engine
    compile_ = GrammarCompiler.compile
    gate = threading.Event()

    def slow(self, spec):  # the compile holds until the free request has decoded a while
        gate.wait(60)
        if spec.value == "bad":
            raise InvalidRequestError("guided_regex: invalid regex: bad")
        return compile_(self, spec)

    spec = GrammarSpec("regex", r"(yes|no), since [a-z]{1,9}\.", "guided_regex")
    p = SamplingParams(temperature=0.0, max_tokens=16, grammar=spec)
    want = smol_llm.generate(prompt_token_ids=[prompts[2]], sampling_params=p)[0].token_ids
    monkeypatch.setattr(GrammarCompiler, "compile", slow)
    free = engine.add_request(prompts[0], SamplingParams(temperature=0.0, max_tokens=12))
    bad = engine.add_request(prompts[1], SamplingParams(temperature=0.0, max_tokens=8,
                                                        grammar=GrammarSpec("regex", "bad")),
                             wait_grammar=False)
    good = engine.add_request(prompts[2], p, wait_grammar=False)
    assert good.grammar_job is not None and good.grammar is None
    outs: list = []
    while engine.has_unfinished():
        outs += engine.step()
        if len(free.output_token_ids) >= 4:
            gate.set()
        if not gate.is_set():
            assert not good.output_token_ids and good in engine.waiting
        time.sleep(0.001)
    assert free.finish_reason == "length" and len(free.output_token_ids) == 12
    assert good.output_token_ids == want
    assert bad.finish_reason == "error" and "invalid regex: bad" in (bad.error or "")
    assert any(o.request is bad and not o.new_token_ids for o in outs)  # its last output
    assert engine.allocator.num_free == engine.allocator.num_blocks
