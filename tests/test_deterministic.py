"""The deterministic mode (`--deterministic`, layers/deterministic.py): a row's result does not
depend on its batch, and a verify row equals the decode row of the same token, bit for bit.

On the CPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, conftest), where
these tests check the kernels' index logic (a tree node's keys read as decode's sequence, one
tile config everywhere); the `gpu` tests check the bits on the GPU's own instructions."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from hotspec.config import ConfigError, EngineConfig  # noqa: E402
from hotspec.core.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from hotspec.layers import deterministic  # noqa: E402
from hotspec.layers.attention import triton_backend, triton_kernels  # noqa: E402

if not torch.cuda.is_available() and not triton_kernels.is_interpreted():
    pytest.skip("the attention kernels were imported compiled before TRITON_INTERPRET was set",
                allow_module_level=True)

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PAGE = 16


def _tree(n: int, g: torch.Generator) -> tuple[list[int], torch.Tensor]:
    """Parents (node 0 the root, parent[i] < i) and the [n, n] ancestor-or-self mask."""
    parents = [-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, i] = True
        if i:
            mask[i] |= mask[parents[i]]
    return parents, mask


class _Cache:
    """A paged KV cache holding sequences at shuffled blocks."""

    def __init__(self, blocks: int, hkv: int, d: int, g: torch.Generator) -> None:
        self.k = torch.zeros(blocks * PAGE + 1, hkv, d, dtype=torch.bfloat16)
        self.v = torch.zeros_like(self.k)
        self.free = torch.randperm(blocks, generator=g).tolist()

    def put(self, k: torch.Tensor, v: torch.Tensor, cols: int) -> torch.Tensor:
        """Store a sequence's K/V [n, hkv, d] at logical 0..n-1; its block-table row."""
        n = k.shape[0]
        row = torch.full((cols,), 1 << 20, dtype=torch.int32)
        for j in range(triton.cdiv(n, PAGE)):
            row[j] = self.free.pop()
        idx = torch.arange(n)
        slots = row[idx // PAGE].long() * PAGE + idx % PAGE
        self.k[slots], self.v[slots] = k, v
        return row


def _fb(mode: ForwardMode, q_lens: list[int], kv_lens: list[int], tables: torch.Tensor,
        width: int | None, positions: torch.Tensor, mask: torch.Tensor | None = None
        ) -> ForwardBatch:
    t = positions.shape[0]
    cu = None if width is not None else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    dv = (lambda x: None if x is None else x.to(DEV))  # noqa: E731
    return ForwardBatch(mode=mode, input_ids=dv(torch.zeros(t, dtype=torch.long)),
                        positions=dv(positions), out_cache_loc=dv(torch.zeros(t, dtype=torch.long)),
                        q_lens=dv(torch.tensor(q_lens)), kv_lens=dv(torch.tensor(kv_lens)),
                        block_tables=dv(tables), width=width, cu_seqlens_q=dv(cu),
                        max_q=max(q_lens) if width is None else width, max_kv=max(kv_lens),
                        custom_mask=dv(mask))


def _attend(backend, fb: ForwardBatch, q: torch.Tensor, cache: _Cache) -> torch.Tensor:
    backend.plan(fb)
    d = q.shape[-1]
    return backend.forward(fb, q.to(DEV), cache.k.to(DEV), cache.v.to(DEV), d ** -0.5).cpu()


@pytest.mark.parametrize("prefix,n,programs", [(60, 8, None), (17, 5, None), (200, 6, 2),
                                               (130, 4, 1)])
def test_verify_rows_equal_decode_rows_and_decode_is_batch_invariant(prefix: int, n: int,
                                                                      programs: int | None):
    """A tree's verify rows (keys: the prefix, then the node's ancestors at their tree slots)
    equal, bit for bit, a decode step of each node's token over the prefix and its path laid out
    in order, alone or among the other nodes' decode steps, and a prefill of that sequence's
    last row; every output is close to the fast path's. Keys in chunks of 64: a chunk a program
    (or `programs` programs sharing a row's chunks), merged by the combine, in the uniform
    phases; one after another in prefill's program."""
    _check_tree_rows(prefix, n, 6, 2, 32, kv_chunk=64, programs=programs)


@pytest.mark.parametrize("prefix,n,programs", [(60, 4, None), (130, 8, 1)])
def test_a_chains_causal_verify_rows_equal_decode_rows(prefix: int, n: int, programs: int | None):
    """A chain (topk 1) verifies causally, several nodes a tile (phases.verify in the mode): its
    rows equal TREE_SEQ's one node a tile, and each node's decode row, bit for bit."""
    _check_tree_rows(prefix, n, 6, 2, 32, kv_chunk=64, programs=programs, chain=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("chain", [False, True], ids=["tree", "chain"])
@pytest.mark.parametrize("prefix,n,hq,hkv,d", [(700, 12, 9, 3, 64), (93, 16, 32, 8, 128),
                                               (1500, 8, 14, 2, 64)])
def test_gpu_verify_rows_equal_decode_rows(prefix: int, n: int, hq: int, hkv: int, d: int,
                                           chain: bool):
    """As above at SmolLM2's, the 8B's and Qwen2.5-0.5B's head shapes, a tree's and a chain's,
    on the GPU's own instructions."""
    _check_tree_rows(prefix, n, hq, hkv, d, chain=chain)


def _check_tree_rows(prefix: int, n: int, hq: int, hkv: int, d: int, kv_chunk: int = 128,
                     programs: int | None = None, chain: bool = False) -> None:
    g = torch.Generator().manual_seed(prefix)
    _, mask = _tree(n, g)
    if chain:  # node i's parent is node i - 1: the mask is causal
        mask = torch.ones(n, n, dtype=torch.bool).tril()
    depth = mask.sum(-1) - 1
    k = torch.randn(prefix + n, hkv, d, generator=g).to(torch.bfloat16)
    v = torch.randn(prefix + n, hkv, d, generator=g).to(torch.bfloat16)
    q = torch.randn(n, hq, d, generator=g).to(torch.bfloat16)
    cache = _Cache((n + 2) * triton.cdiv(prefix + n, PAGE), hkv, d, g)  # (the tree's, n paths)
    cols = triton.cdiv(prefix + n, PAGE) + 1
    det = triton_backend.TritonBackend(PAGE, triton_backend.KernelTuning(
        deterministic=True, kv_chunk=kv_chunk, num_splits=programs))

    tree_table = cache.put(k, v, cols)[None]  # the prefix, then node i at prefix + i
    verify = _attend(det, _fb(ForwardMode.VERIFY, [n], [prefix + n], tree_table, n,
                              prefix + depth, mask[None]), q, cache)
    if chain:  # as phases.verify passes a chain in the mode: causal, several nodes a tile
        causal = _attend(det, _fb(ForwardMode.VERIFY, [n], [prefix + n], tree_table, n,
                                  prefix + depth), q, cache)
        assert torch.equal(causal, verify), "a chain's causal verify differs from TREE_SEQ's"

    paths, tables = [], []  # node i's keys as decode reads them: the prefix, then its path
    for i in range(n):
        path = [j for j in range(n) if mask[i, j]]  # ancestors have smaller indices: depth order
        seq = list(range(prefix)) + [prefix + j for j in path]
        paths.append(seq)
        tables.append(cache.put(k[seq], v[seq], cols))
    lens = [len(s) for s in paths]
    batch = _attend(det, _fb(ForwardMode.DECODE, [1] * n, lens, torch.stack(tables), 1,
                             torch.tensor(lens) - 1), q, cache)
    for i in range(n):
        alone = _attend(det, _fb(ForwardMode.DECODE, [1], [lens[i]], tables[i][None], 1,
                                 torch.tensor([lens[i] - 1])), q[i:i + 1], cache)
        assert torch.equal(alone[0], batch[i]), f"decode row {i} changes with its batch"
        assert torch.equal(verify[i], alone[0]), f"verify row {i} differs from its decode row"

    # a prefill of node n-1's sequence (and another request beside it): its last row is decode's
    last = paths[-1]
    qs = torch.randn(len(last), hq, d, generator=g).to(torch.bfloat16)
    qs[-1] = q[-1]
    other = torch.randn(9, hq, d, generator=g).to(torch.bfloat16)
    table = torch.stack([tables[-1], tables[0]])
    pre = _attend(det, _fb(ForwardMode.PREFILL, [len(last), 9], [len(last), 9], table, None,
                           torch.cat([torch.arange(len(last)), torch.arange(9)])),
                  torch.cat([qs, other]), cache)
    assert torch.equal(pre[len(last) - 1], verify[-1]), "a prefill row differs from decode's"

    ref = triton_backend.TritonBackend(PAGE)  # the fast path: close, not necessarily equal
    fast = _attend(ref, _fb(ForwardMode.VERIFY, [n], [prefix + n], tree_table, n, prefix + depth,
                            mask[None]), q, cache)
    torch.testing.assert_close(verify.float(), fast.float(), rtol=2e-2, atol=2e-2)


def test_a_verify_batch_is_its_trees_nodes():
    """The deterministic verify reads a node's ancestors from its own mask row: a verify batch
    whose rows are not the tree's nodes is refused, not read wrong."""
    mask = torch.ones(1, 2, 4, dtype=torch.bool)
    fb = _fb(ForwardMode.VERIFY, [2], [10], torch.zeros(1, 2, dtype=torch.int32), 2,
             torch.arange(2), mask)
    det = triton_backend.TritonBackend(PAGE, triton_backend.KernelTuning(deterministic=True))
    with pytest.raises(ValueError, match="rows are its tree's nodes"):
        det.plan(fb)


def test_mode_is_scoped():
    assert not deterministic.on()
    with deterministic.mode(True):
        assert deterministic.on()
        with deterministic.mode(False):
            assert not deterministic.on()
        assert deterministic.on()
    assert not deterministic.on()


def test_deterministic_tuning_fixes_the_choices_that_follow_the_batch():
    """The RoPE fold and packed masks whatever is asked, fixed chunks (their count from the
    static bound alone; num_splits: the programs sharing a row's chunks); its own tile config
    unless one is given (a benchmark's variant, still one config for every phase)."""
    b = triton_backend.TritonBackend(PAGE, triton_backend.KernelTuning(
        deterministic=True, num_splits=8, fold_rope=False, mask_bits=False))
    assert b.deterministic and b.fold_rope and b.mask_bits and b.num_splits == 8
    assert (b.block_n, b.block_m, b.num_stages, b.num_warps, b.kv_chunk) == (None, 16, 2, 4, 128)
    plan = triton_backend.TritonPlan(*[torch.zeros(1)] * 3, None, None, 1, 1, 8208)
    assert b._chunks(plan) == 65  # (of the static bound: whatever the batch)
    assert b._splits(plan, 1, 16, 64, torch.device("cpu")) == 8  # programs sharing them
    b = triton_backend.TritonBackend(PAGE, triton_backend.KernelTuning(
        deterministic=True, block_n=128, num_stages=3, kv_chunk=256))
    assert (b.block_n, b.num_stages) == (128, 3)
    with pytest.raises(ValueError, match="kv_chunk 96: a multiple of the kv tile"):
        triton_backend.TritonBackend(PAGE, triton_backend.KernelTuning(deterministic=True,
                                                                       kv_chunk=96))
    assert [triton_backend.det_kv_chunk(n) for n in (512, 8208, 16400, 131072)] == \
        [128, 128, 256, 1024]


def test_deterministic_needs_cuda_and_the_triton_backend(tmp_path):
    """--deterministic refuses what it cannot keep: the torch attention, and a CPU engine."""
    with pytest.raises(ConfigError, match="--attention-backend triton"):
        EngineConfig(deterministic=True, attention_backend="torch")
    with pytest.raises(ConfigError, match="at most 64 draft tokens, got 8/8/80"):
        EngineConfig(deterministic=True, speculative_algorithm="EAGLE3", speculative_num_steps=8,
                     speculative_eagle_topk=8, speculative_num_draft_tokens=80)
    with pytest.raises(ConfigError, match="at most 64 draft tokens"):
        EngineConfig(deterministic=True, speculative_algorithm="EAGLE3",
                     speculative_candidates=("off", "8/8/80"))
    EngineConfig(speculative_algorithm="EAGLE3", speculative_num_steps=8, speculative_eagle_topk=8,
                 speculative_num_draft_tokens=80)  # (outside the mode: byte masks)
    if not torch.cuda.is_available():
        from engine_utils import save_tiny_llama

        from hotspec.engine.engine import Engine

        path = save_tiny_llama(tmp_path / "t", vocab=64, hidden=32, layers=1, std=0.2)
        with pytest.raises(ConfigError, match="CUDA"):
            Engine(EngineConfig(model=str(path), deterministic=True, skip_tokenizer_init=True,
                                num_kv_blocks=8))


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 40000, (int(torch.randint(3, 60, (), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_deterministic_greedy_is_batch_invariant_and_speculative_equals_vanilla(tmp_path):
    """bf16, graphed: every prompt's greedy tokens are the same alone and in a batch of 4 or 8,
    and with the prompts prefilled in 16-token chunks; the speculative engines (a 3/4/8 tree, a
    3/1/4 chain) produce vanilla's tokens bit for bit."""
    from engine_utils import greedy_tokens, random_engine

    from hotspec.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    prompts = _prompts(8, 3)
    vanilla = random_engine(deterministic=True, cuda_graph_max_bs=8, max_num_seqs=8)
    alone = [greedy_tokens(vanilla, [p], params)[0] for p in prompts]
    assert greedy_tokens(vanilla, prompts[:4], params) == alone[:4]
    assert greedy_tokens(vanilla, prompts, params) == alone
    del vanilla
    chunked = random_engine(deterministic=True, cuda_graph_max_bs=8, max_num_seqs=8,
                            max_prefill_tokens=16)
    assert greedy_tokens(chunked, prompts, params) == alone
    del chunked
    for shape in [dict(), dict(speculative_num_steps=3, speculative_eagle_topk=1,
                                speculative_num_draft_tokens=4)]:
        spec = random_engine(tmp_path / str(len(shape)), algo="EAGLE3", deterministic=True,
                             cuda_graph_max_bs=8, max_num_seqs=8, **shape)
        assert greedy_tokens(spec, prompts, params) == alone, shape
        assert [greedy_tokens(spec, [p], params)[0] for p in prompts[:3]] == alone[:3], shape
        del spec
