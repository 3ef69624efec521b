"""The speculative bookkeeping kernels against the torch code they replace: the phases' index
bookkeeping (speculative/phase_inputs_kernel.py), the draft tree (speculative/tree_kernel.py) and
greedy acceptance with the commit's rows (speculative/accept_kernel.py), on the CPU in Triton's
interpreter and on CUDA at real shapes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tree_cases import candidates, matching_logits  # noqa: E402

from hotspec.speculative import phase_inputs as pi  # noqa: E402
from hotspec.speculative import phase_inputs_kernel as pik  # noqa: E402
from hotspec.speculative.accept_kernel import greedy_accept as accept_kernel  # noqa: E402
from hotspec.speculative.tree import build_tree_torch  # noqa: E402
from hotspec.speculative.tree_kernel import build_tree as tree_kernel  # noqa: E402
from hotspec.speculative.verify import commit_rows, verify_greedy  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = [(3, 1, 4), (7, 1, 8), (4, 8, 12), (6, 8, 16), (3, 4, 10), (6, 10, 60)]


def _case(b: int, shape: tuple[int, int, int], seed: int):  # type: ignore[no-untyped-def]
    steps, k, n = shape
    g = torch.Generator().manual_seed(seed)
    vocab = 50
    scores, tokens, parents = candidates(b, steps, k, vocab, g)
    root = torch.randint(0, vocab, (b,), generator=g)
    return g, vocab, [t.to(DEV) for t in (root, scores, tokens, parents)], n, steps


def _tables(b: int, seed: int) -> torch.Tensor:
    """Block tables of b requests, 32 pages of 4 each, in a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(128, generator=g)[:b * 32].view(b, 32).to(torch.int32).to(DEV)


def _same(out: tuple, ref: tuple) -> None:
    for name, a, r in zip(ref._fields, out, ref):  # type: ignore[attr-defined]
        assert a.dtype == r.dtype and a.shape == r.shape, name
        assert torch.equal(a, r), f"{name} differ"


@pytest.mark.parametrize("shape", SHAPES)
def test_phase_inputs_kernels_match_torch(shape):
    """Every step's draft scratch slots (across page boundaries: pages of 4), positions, root
    mask rows and lengths; verify's slots, positions and lengths; draft_extend's shifted ids,
    slots (looked up, or the step's own) with the trash slot past each accepted length,
    positions and next-root rows."""
    steps, k, n = shape
    b, page, w = 3, 4, max(steps + 1, n)
    tables, seq = _tables(b, steps * k), torch.tensor([1, 7, 30], device=DEV)
    _same(pik.draft_inputs(tables, seq, k, steps - 1, page),
          pi.draft_inputs_torch(tables, seq, k, steps - 1, page))
    g = torch.Generator().manual_seed(n)
    depth = torch.randint(0, steps + 1, (b, n), generator=g).to(DEV)
    _same(pik.verify_inputs(tables, seq, depth, w, page),
          pi.verify_inputs_torch(tables, seq, depth, w, page))
    acc = torch.randint(0, 1000, (b, steps + 1), generator=g).to(DEV)
    bonus = torch.randint(0, 1000, (b,), generator=g).to(DEV)
    a = torch.tensor([1, steps + 1, 2], device=DEV).clamp_max(steps + 1)
    slots = pi.verify_inputs_torch(tables, seq, depth, w, page).slots
    for given in (None, slots[:, :steps + 1]):
        _same(pik.extend_inputs(tables, seq, acc, bonus, a, given, 999, page),
              pi.extend_inputs_torch(tables, seq, acc, bonus, a, given, 999, page))


@pytest.mark.parametrize("shape", SHAPES)
def test_tree_kernel_matches_torch(shape):
    _, _, args, n, steps = _case(5, shape, seed=sum(shape))
    ref = build_tree_torch(*args, n, steps)
    out = tree_kernel(*args, n, steps)
    for name in ("tokens", "parents", "depth", "mask"):
        a, r = getattr(out, name), getattr(ref, name)
        assert a.dtype == r.dtype and a.shape == r.shape, name
        assert torch.equal(a, r), f"{name} differ"


def test_tree_kernel_ties_keep_the_parent():
    """A child whose score rounds to its parent's: the earlier candidate (the parent) is kept, so
    the tree stays ancestor-closed (every kept node's parent is kept, before it)."""
    scores = torch.tensor([[-20.0, -21.0, -20.0, -22.0]], device=DEV)  # node 2 (child of 0) ties 0
    tokens = torch.tensor([[5, 6, 7, 8]], device=DEV)
    parents = torch.tensor([[-1, -1, 0, 1]], device=DEV)
    tree = tree_kernel(torch.tensor([9], device=DEV), scores, tokens, parents, 3, 2)
    assert tree.tokens.tolist() == [[9, 5, 7]]
    assert tree.parents.tolist() == [[0, 0, 1]]
    assert tree.depth.tolist() == [[0, 1, 2]]


def test_tree_kernel_nan_scores_stay_in_range():
    """A padded row's NaN scores rank last: the tree holds real candidates, with valid parents."""
    _, _, (root, scores, tokens, parents), n, steps = _case(2, (4, 8, 12), seed=1)
    scores[0] = float("nan")
    scores[1, :5] = float("nan")
    tree = tree_kernel(root, scores, tokens, parents, n, steps)
    assert bool((tree.parents >= 0).all()) and bool((tree.parents < n).all())
    assert bool((tree.depth[:, 1:] >= 1).all()) and bool((tree.depth <= steps).all())


@pytest.mark.parametrize("shape", SHAPES)
def test_accept_kernel_matches_torch(shape):
    b = 6
    g, vocab, args, n, steps = _case(b, shape, seed=7 * sum(shape))
    tree = build_tree_torch(*args, n, steps)
    pred = matching_logits(tree, vocab, g, p=0.9).to(DEV).argmax(-1)
    w = steps + 1
    slots = torch.randperm(1000, generator=g)[: b * max(n, w)].view(b, max(n, w)).to(DEV)
    ref = commit_rows(tree, verify_greedy(tree, pred, steps, argmaxed=True), slots, 3)
    path, a, bonus, toks, src, dst = accept_kernel(pred, tree.tokens, tree.parents, tree.depth,
                                                   tree.mask, slots, 3, steps)
    assert torch.equal(a, ref.acc.accept_len)
    assert torch.equal(path, ref.acc.path)
    assert torch.equal(bonus, ref.acc.bonus)
    assert torch.equal(toks, ref.tokens)
    assert torch.equal(src, ref.src) and torch.equal(dst, ref.dst)
    if shape[1] > 1:
        assert int(a.max()) > 2  # the cases reach deep paths


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 32])
@pytest.mark.parametrize("shape", [(6, 8, 16), (6, 10, 64)])
def test_kernels_real_shapes(b, shape):
    _, _, args, n, steps = _case(b, shape, seed=b)
    ref = build_tree_torch(*args, n, steps)
    out = tree_kernel(*args, n, steps)
    assert all(torch.equal(getattr(out, f), getattr(ref, f)) for f in ("tokens", "parents", "depth", "mask"))


@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 4, 8)], ids=["chain", "tree"])
def test_engine_with_the_bookkeeping_kernels_equals_vanilla(shape, tmp_path, monkeypatch):
    """The EAGLE-3 engine with every bookkeeping kernel in the loop (CPU tensors take the fused
    kernels, through Triton's interpreter): the phases' index inputs, the frontier, the tree and
    greedy acceptance. float32 greedy output equals vanilla's (torch ops) token for token (a
    32-token vocabulary, so the random head's drafts are accepted now and then)."""
    from engine_utils import save_tiny_llama

    from hotspec import LLM, SamplingParams
    from hotspec.layers import fused
    from hotspec.models.draft_checkpoint import random_draft_checkpoint
    from hotspec.models.loader import load_checkpoint

    path = save_tiny_llama(tmp_path / "target", vocab=32, hidden=64, layers=6, std=0.3)
    cfg, _ = load_checkpoint(str(path), torch.float32)
    head = random_draft_checkpoint(tmp_path / "head", cfg, "EAGLE3", seed=3)
    prompts = [[1, 5, 9, 3, 2], list(range(4, 20))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=2,
              kv_cache_memory_gb=0.01)
    want = [o.token_ids for o in LLM(str(path), **kw).generate(prompt_token_ids=prompts,
                                                                 sampling_params=params)]
    monkeypatch.setattr(fused, "_on_device", lambda x: True)
    steps, topk, ntok = shape
    spec = LLM(str(path), speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
               speculative_num_steps=steps, speculative_eagle_topk=topk,
               speculative_num_draft_tokens=ntok, **kw)
    got = spec.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in got] == want
    if topk > 1:  # drafts were accepted: fewer steps than tokens after the prefill's
        assert sum(o.stats.spec_steps for o in got) < sum(len(o.token_ids) - 1 for o in got)
