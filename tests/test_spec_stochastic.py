"""Speculative sampling is lossless: with EAGLE / EAGLE-3 drafting, chain or tree, the tokens have
exactly the target model's (shaped) distribution.

A tiny random Llama with a 16-token vocabulary has an exactly computable distribution over its first
three sampled tokens: p(x1, x2, x3) = p(x1) p(x2 | x1) p(x3 | x1, x2), with every conditional taken
from transformers' own forward pass over all 16^2 two-token continuations of the prompt and shaped
by an independent float64 reference (temperature, then top-p). 20,000 requests (seed = request
index) are compared with it by Pearson chi-square. The same check on vanilla sampling validates the
reference, and a deliberately wrong verifier shows that the check has the power to fail.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import hotspec.speculative.phases as eagle_phases
from hotspec import LLM, SamplingParams
from hotspec.layers.sampler import random_uniform, sample_from_probs
from hotspec.models.draft_checkpoint import random_draft_checkpoint
from hotspec.models.loader import load_checkpoint
from hotspec.speculative.tree import DraftTree
from hotspec.speculative.verify import STREAM_BONUS, STREAM_COIN, Acceptance, _walk

VOCAB = 16
PROMPT = [2, 7, 1, 8, 2, 8]  # its top-p 0.9 cuts are >= 6e-5 from any cumulative mass
NUM_SAMPLES = 20_000
BATCH = 2048
# One chi-square per depth (x1; x1 x2; x1 x2 x3), Bonferroni: the family fails by chance at most 1%.
ALPHA = 0.01 / 3
MIN_EXPECTED = 5.0

SHAPES = {"chain": (3, 1, 4), "tree": (3, 4, 8)}  # (num_steps, topk, num_draft_tokens)
SAMPLING = {"t1": (1.0, 1.0), "t0.7": (0.7, 1.0), "t1-top_p0.9": (1.0, 0.9)}  # (temperature, top_p)


@dataclass
class Models:
    target: Path
    heads: dict[str, Path]
    hf: Any  # transformers LlamaForCausalLM, float64, for the exact distribution
    exact: dict[tuple[float, float], np.ndarray] = field(default_factory=dict)  # by (T, top_p)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("spec_stochastic")
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # large weights: a peaked but far from one-hot next-token distribution
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.4)
    hf.save_pretrained(root / "target")
    save_letter_tokenizer(root / "target")
    target_cfg, _ = load_checkpoint(root / "target", torch.float32)
    heads = {
        # Larger than the default 0.02 so that the draft's top-k is decisive, not float noise.
        "EAGLE": random_draft_checkpoint(root / "eagle", target_cfg, "EAGLE", seed=1, scale=0.3),
        # A 2-layer target has only two capture points (inputs of layers 0 and 1): ids -1 and 0.
        "EAGLE3": random_draft_checkpoint(
            root / "eagle3", target_cfg, "EAGLE3", seed=2, scale=0.3,
            extra_config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 0]}}),
    }
    return Models(root / "target", heads, hf.double())


def save_letter_tokenizer(path: Path) -> None:
    """One letter per token id, a..p (p: EOS): what grammars are written over."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate("abcdefghijklmnop"[:VOCAB])}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="a")),
                            eos_token="p").save_pretrained(path)


# -- the exact distribution -------------------------------------------------------------------
def shape_reference(logits: torch.Tensor, temperature: float, top_p: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (probs, mass before each token in descending order): temperature, then top-p
    (the smallest descending prefix whose mass reaches top_p)."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    kept = torch.where((before < top_p) | (top_p >= 1), sorted_p, 0.0)
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(kept).scatter_(-1, order, kept), before


def exact_joint(models: Models, temperature: float, top_p: float) -> np.ndarray:
    """[V, V, V] float64 p(x1, x2, x3) after PROMPT, from all 256 two-token continuations."""
    key = (temperature, top_p)
    if key not in models.exact:
        pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))  # row a*V + b
        ids = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], dim=1)
        with torch.no_grad():
            logits = models.hf(ids).logits[:, len(PROMPT) - 1 :]  # [256, 3, V]: x1, x2|x1, x3|x1 x2
        probs, before = shape_reference(logits, temperature, top_p)
        if top_p < 1:  # float32 engine vs float64 reference: no token may sit on the cut
            assert (before - top_p).abs().min() > 1e-5
        p1 = probs[0, 0]
        p2 = probs[::VOCAB, 1]  # [a, b] = p(b | a)
        p3 = probs[:, 2].reshape(VOCAB, VOCAB, VOCAB)  # [a, b, c] = p(c | a, b)
        joint = (p1[:, None, None] * p2[:, :, None] * p3).numpy()
        assert abs(joint.sum() - 1) < 1e-9
        models.exact[key] = joint
    return models.exact[key]


def test_target_distribution_is_moderate(models: Models) -> None:
    """Neither near-uniform nor near-one-hot, so the chi-square tests below have teeth."""
    joint = exact_joint(models, 1.0, 1.0)
    p1 = joint.sum((1, 2))
    p12 = joint.sum(2)
    h1 = -(p1 * np.log(p1)).sum()
    h2_given_1 = -(p12 * np.log(p12 / p1[:, None])).sum()
    h3_given_12 = -(joint * np.log(joint / p12[:, :, None])).sum()
    for h in (h1, h2_given_1, h3_given_12):
        assert 0.25 * math.log(VOCAB) < h < 0.9 * math.log(VOCAB)
    assert p1.max() < 0.8 and joint.max() < 0.3
    assert (joint.ravel() * NUM_SAMPLES >= MIN_EXPECTED).sum() >= 100  # many cells tested alone


# -- chi-square -------------------------------------------------------------------------------
def pooled_chisquare(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value of `counts` against `probs` (same shape). Cells are sorted by
    expected count and the smallest pooled until every bin expects at least MIN_EXPECTED; the
    binning depends on `probs` only. Zero-probability cells must be empty and are left out."""
    counts, probs = counts.ravel().astype(np.float64), probs.ravel()
    impossible = probs == 0
    assert counts[impossible].sum() == 0, "a sample landed where the target has probability 0"
    counts, expected = counts[~impossible], counts.sum() * probs[~impossible]
    obs_bins: list[float] = []
    exp_bins: list[float] = []
    acc_obs = acc_exp = 0.0
    for i in np.argsort(expected, kind="stable"):
        acc_obs += counts[i]
        acc_exp += expected[i]
        if acc_exp >= MIN_EXPECTED:
            obs_bins.append(acc_obs)
            exp_bins.append(acc_exp)
            acc_obs = acc_exp = 0.0
    obs_bins[-1] += acc_obs  # a remainder below the threshold joins the last (largest) bin
    exp_bins[-1] += acc_exp
    assert len(obs_bins) >= 2
    exp = np.array(exp_bins)
    exp *= sum(obs_bins) / exp.sum()  # float64 rounding only
    return float(chisquare(np.array(obs_bins), exp).pvalue)


def depth_pvalues(tokens: np.ndarray, joint: np.ndarray) -> list[float]:
    """p-values for x1, (x1, x2) and (x1, x2, x3) against the exact joint."""
    counts = np.zeros((VOCAB,) * 3, dtype=np.int64)
    np.add.at(counts, (tokens[:, 0], tokens[:, 1], tokens[:, 2]), 1)
    return [pooled_chisquare(counts.sum((1, 2)), joint.sum((1, 2))),
            pooled_chisquare(counts.sum(2), joint.sum(2)),
            pooled_chisquare(counts, joint)]


# -- sampling through the engine --------------------------------------------------------------
def sample_tokens(models: Models, temperature: float, top_p: float,
                  setup: Callable[[LLM], None] | None = None, **engine_kwargs: Any
                  ) -> tuple[np.ndarray, LLM]:
    """[NUM_SAMPLES, 3] first tokens of NUM_SAMPLES seeded requests (seed = index); `setup` may
    adjust the engine first."""
    llm = LLM(model=str(models.target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              max_num_seqs=BATCH, num_kv_blocks=3 * BATCH, block_size=8, **engine_kwargs)
    if setup is not None:
        setup(llm)
    params = [SamplingParams(temperature=temperature, top_p=top_p, seed=i, max_tokens=3,
                             ignore_eos=True) for i in range(NUM_SAMPLES)]
    t0 = time.perf_counter()
    outs = llm.generate(prompt_token_ids=[PROMPT] * NUM_SAMPLES, sampling_params=params)
    print(f"{NUM_SAMPLES} requests in {time.perf_counter() - t0:.1f} s")
    assert llm.engine.allocator.num_free == 3 * BATCH
    tokens = np.array([o.token_ids for o in outs], dtype=np.int64)
    assert tokens.shape == (NUM_SAMPLES, 3)
    return tokens, llm


def spec_kwargs(models: Models, head: str, shape: str) -> dict[str, Any]:
    steps, topk, ntok = SHAPES[shape]
    return dict(speculative_algorithm=head, speculative_draft_model_path=str(models.heads[head]),
                speculative_num_steps=steps, speculative_eagle_topk=topk,
                speculative_num_draft_tokens=ntok)


@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_vanilla_sampling_matches_exact(models: Models, sampling: str) -> None:
    """Validates the reference and the test: plain sampling must pass it."""
    temperature, top_p = SAMPLING[sampling]
    tokens, _ = sample_tokens(models, temperature, top_p)
    pvals = depth_pvalues(tokens, exact_joint(models, temperature, top_p))
    print(sampling, "p-values", pvals)
    assert min(pvals) > ALPHA, pvals


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("head", ["EAGLE", "EAGLE3"])
def test_speculative_sampling_is_lossless(models: Models, head: str, shape: str, sampling: str) -> None:
    temperature, top_p = SAMPLING[sampling]
    tokens, llm = sample_tokens(models, temperature, top_p, **spec_kwargs(models, head, shape))
    hist: Counter[int] = llm.engine.worker.stats.accept_hist
    print(head, shape, sampling, "accept_hist", dict(sorted(hist.items())))
    # Both branches of verification ran: drafts were accepted (>1 token per pass) and rejected.
    assert sum(n for a, n in hist.items() if a > 1) > 100
    assert hist[1] > 100
    pvals = depth_pvalues(tokens, exact_joint(models, temperature, top_p))
    print(head, shape, sampling, "p-values", pvals)
    assert min(pvals) > ALPHA, pvals


def test_vanilla_at_wrong_temperature_is_rejected(models: Models) -> None:
    """Power: temperature 1.0 samples are told apart from the temperature-0.9 distribution."""
    tokens, _ = sample_tokens(models, 1.0, 1.0)
    pvals = depth_pvalues(tokens, exact_joint(models, 0.9, 1.0))
    print("T=1.0 samples vs T=0.9 exact: p-values", pvals)
    assert pvals[2] < 1e-6


def _verify_without_renormalising(tree: DraftTree, probs: torch.Tensor, max_depth: int,
                                  seeds: torch.Tensor, offsets: torch.Tensor) -> Acceptance:
    """verify_stochastic with a classic bug: a rejected token is removed from the residual but
    the residual is not renormalised, so later siblings are accepted too rarely."""
    coins = random_uniform(seeds, offsets, tree.num_nodes, stream=STREAM_COIN)
    residual = probs[:, 0].clone()

    def accept(j: int, candidate: torch.Tensor) -> torch.Tensor:
        nonlocal residual
        x = tree.tokens[:, j : j + 1]
        ok = candidate & (coins[:, j] < torch.gather(residual, 1, x).squeeze(1))
        residual = torch.where((candidate & ~ok).unsqueeze(1), residual.scatter(1, x, 0.0), residual)
        residual = torch.where(ok.unsqueeze(1), probs[:, j], residual)
        return ok

    cur, path = _walk(tree, max_depth, accept)
    bonus = sample_from_probs(residual, seeds, offsets, stream=STREAM_BONUS)
    return Acceptance(path, torch.gather(tree.depth, 1, cur.unsqueeze(1)).squeeze(1) + 1, bonus)


def test_biased_verifier_is_rejected(models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power against a realistic verification bug, through the whole speculative engine."""
    monkeypatch.setattr(eagle_phases, "verify_stochastic", _verify_without_renormalising)
    tokens, _ = sample_tokens(models, 1.0, 1.0, **spec_kwargs(models, "EAGLE3", "tree"))
    pvals = depth_pvalues(tokens, exact_joint(models, 1.0, 1.0))
    print("unnormalised residual: p-values", pvals)
    assert pvals[2] < 1e-6


@pytest.mark.parametrize("shape", list(SHAPES))
def test_speculative_sampling_with_token_map_is_lossless(models: Models, shape: str,
                                                         tmp_path: Path) -> None:
    """FR-Spec: a hot set of 6 of the 16 tokens. The draft can only propose hot tokens; the
    target still samples from its whole distribution."""
    tmap = tmp_path / "freq_6.pt"
    torch.save([3, 0, 7, 12, 5, 9], tmap)
    kwargs = dict(spec_kwargs(models, "EAGLE", shape), speculative_token_map=str(tmap))
    tokens, llm = sample_tokens(models, 1.0, 1.0, **kwargs)
    assert llm.engine.draft.draft_vocab_size == 6
    hist: Counter[int] = llm.engine.worker.stats.accept_hist
    assert sum(n for a, n in hist.items() if a > 1) > 100 and hist[1] > 100
    assert 0.0 < llm.engine.worker.stats.hot_coverage < 1.0
    pvals = depth_pvalues(tokens, exact_joint(models, 1.0, 1.0))
    assert min(pvals) > ALPHA, pvals


def test_sampling_stays_exact_across_shape_switches(models: Models) -> None:
    """--speculative-adaptive switching at random before every step between plain decoding, a
    chain and a tree (the draft catching up after plain steps): still the exact distribution."""
    from hotspec.core.spec_shape import SpecShape
    from hotspec.speculative.adaptive import Choice

    shapes = [SpecShape.parse(c) for c in ("off", "2/1/3", "3/4/8")]
    rng = random.Random(0)
    picked: Counter[str] = Counter()

    class RandomShapes:
        probe_every = 0

        def choose(self, bs: int, rids: list[int] | None = None) -> Choice:
            s = rng.choice(shapes)
            picked[s.label] += 1
            return Choice(s, {})

        def observe(self, *args: Any) -> None:
            pass

        def observe_catch_up(self, *args: Any) -> None:
            pass

    def setup(llm: LLM) -> None:
        llm.engine.worker.policy = RandomShapes()

    temperature, top_p = SAMPLING["t1"]
    tokens, llm = sample_tokens(models, temperature, top_p, setup,
                                speculative_algorithm="EAGLE3",
                                speculative_draft_model_path=str(models.heads["EAGLE3"]),
                                speculative_adaptive=True,
                                speculative_candidates=("off", "2/1/3", "3/4/8"))
    assert set(picked) == {"off", "2/1/3", "3/4/8"}
    assert llm.engine.worker.stats.phase_calls["catch_up"] > 0
    pvals = depth_pvalues(tokens, exact_joint(models, temperature, top_p))
    print("adaptive p-values", pvals, dict(picked))
    assert min(pvals) > ALPHA, pvals


def joint_of(probs: torch.Tensor) -> np.ndarray:
    """[V, V, V] p(x1, x2, x3) from the conditionals of all 256 continuations [256, 3, V]."""
    p1, p2, p3 = probs[0, 0], probs[::VOCAB, 1], probs[:, 2].reshape(VOCAB, VOCAB, VOCAB)
    joint = (p1[:, None, None] * p2[:, :, None] * p3).numpy()
    assert abs(joint.sum() - 1) < 1e-9
    return joint


# -- logits processing (penalties, logit_bias) ------------------------------------------------
PENALTIES = dict(presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.3,
                 logit_bias={3: 1.5, 11: -2.0})


def exact_joint_penalized(models: Models, temperature: float) -> np.ndarray:
    """As exact_joint, each position's logits processed first (SamplingParams' order): bias,
    repetition over prompt and generated tokens, presence and frequency over generated ones."""
    pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], dim=1)
    with torch.no_grad():
        logits = models.hf(ids).logits[:, len(PROMPT) - 1 :].double()  # [256, 3, V]
    counts = torch.zeros_like(logits)
    one_a = torch.nn.functional.one_hot(pairs[:, 0], VOCAB).double()
    counts[:, 1] = one_a
    counts[:, 2] = one_a + torch.nn.functional.one_hot(pairs[:, 1], VOCAB).double()
    bias = torch.zeros(VOCAB, dtype=torch.float64)
    for t, v in PENALTIES["logit_bias"].items():  # type: ignore[attr-defined]
        bias[t] = v
    prompt = torch.zeros(VOCAB, dtype=torch.bool)
    prompt[PROMPT] = True
    x = logits + bias
    r = PENALTIES["repetition_penalty"]
    x = torch.where(prompt | (counts > 0), torch.where(x > 0, x / r, x * r), x)
    x = x - PENALTIES["presence_penalty"] * (counts > 0) - PENALTIES["frequency_penalty"] * counts
    probs, _ = shape_reference(x, temperature, 1.0)
    return joint_of(probs)


@pytest.mark.parametrize("shape", ["vanilla", *SHAPES])
def test_sampling_with_penalties_is_exact(models: Models, shape: str) -> None:
    """Penalties and logit_bias applied to every tree node with the counts along its path keep
    speculative sampling exact (vanilla validates the reference)."""
    kw = {} if shape == "vanilla" else spec_kwargs(models, "EAGLE3", shape)
    llm = LLM(model=str(models.target), dtype="float32", device="cpu", skip_tokenizer_init=True,
              max_num_seqs=BATCH, num_kv_blocks=3 * BATCH, block_size=8, **kw)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=3, ignore_eos=True,
                             **PENALTIES) for i in range(NUM_SAMPLES)]  # type: ignore[arg-type]
    outs = llm.generate(prompt_token_ids=[PROMPT] * NUM_SAMPLES, sampling_params=params)
    tokens = np.array([o.token_ids for o in outs], dtype=np.int64)
    if shape != "vanilla":
        hist = llm.engine.worker.stats.accept_hist
        assert sum(n for a, n in hist.items() if a > 1) > 100 and hist[1] > 100
    pvals = depth_pvalues(tokens, exact_joint_penalized(models, 0.8))
    print(shape, "p-values", pvals)
    assert min(pvals) > ALPHA, pvals


# -- structured output (a grammar) ------------------------------------------------------------
GRAMMAR = "(a[b-f]|[b-h][a-c])[a-h]"  # x2's letters depend on x1


def grammar_allows(x1: int, x2: int, x3: int) -> bool:
    return x1 <= 7 and (1 <= x2 <= 5 if x1 == 0 else x2 <= 2) and x3 <= 7


def exact_joint_grammar(models: Models, temperature: float) -> np.ndarray:
    """As exact_joint, each position's logits masked by GRAMMAR (-inf where it refuses)."""
    pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(pairs), -1), pairs], dim=1)
    with torch.no_grad():
        logits = models.hf(ids).logits[:, len(PROMPT) - 1 :].double()  # [256, 3, V]
    allowed = torch.zeros(len(pairs), 3, VOCAB, dtype=torch.bool)
    allowed[:, 0, :8] = True
    allowed[:, 2, :8] = True
    x1 = pairs[:, 0]
    allowed[:, 1, 1:6] = (x1 == 0).unsqueeze(1)
    allowed[:, 1, :3] |= ((x1 >= 1) & (x1 <= 7)).unsqueeze(1)
    allowed[:, 1, 0] &= x1 != 0
    allowed[:, 2] &= allowed[:, 1].any(-1, keepdim=True)  # (x1 outside: nothing follows)
    x = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(x / temperature, dim=-1))
    return joint_of(probs)


@pytest.mark.parametrize("shape", ["vanilla", *SHAPES])
def test_sampling_with_a_grammar_is_exact(models: Models, shape: str) -> None:
    """The grammar's mask on every tree node (the one after its path) keeps speculative sampling
    exact; every answer matches the grammar."""
    from hotspec.sampling_params import GrammarSpec

    kw = {} if shape == "vanilla" else spec_kwargs(models, "EAGLE3", shape)
    llm = LLM(model=str(models.target), dtype="float32", device="cpu", max_num_seqs=BATCH,
              num_kv_blocks=3 * BATCH, block_size=8, **kw)
    grammar = GrammarSpec("regex", GRAMMAR)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=3, ignore_eos=True,
                             grammar=grammar) for i in range(NUM_SAMPLES)]
    t0 = time.perf_counter()
    outs = llm.generate(prompt_token_ids=[PROMPT] * NUM_SAMPLES, sampling_params=params)
    print(f"{NUM_SAMPLES} requests in {time.perf_counter() - t0:.1f} s")
    tokens = np.array([o.token_ids for o in outs], dtype=np.int64)
    assert all(grammar_allows(*row) for row in tokens.tolist())
    if shape != "vanilla":
        hist = llm.engine.worker.stats.accept_hist
        assert sum(n for a, n in hist.items() if a > 1) > 100 and hist[1] > 100
    pvals = depth_pvalues(tokens, exact_joint_grammar(models, 0.8))
    print(shape, "p-values", pvals)
    assert min(pvals) > ALPHA, pvals
