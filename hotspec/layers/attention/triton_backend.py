"""Triton paged-attention backend: one flash-attention kernel for every phase (triton_kernels.py).

Design
  * grid (query blocks [x kv splits], B, Hkv). A program handles BLOCK_Q query rows of request b
    for all `group = Hq // Hkv` query heads of kv head h, folded into the tile's M dimension
    (BLOCK_M = BLOCK_Q * next_pow2(group) >= 16), so decode's single query row still fills a
    tensor-core tile and every K/V block is loaded once per kv head.
  * queries: uniform layout (`fb.width` rows per request, row b * width + i) or ragged prefill
    (`fb.cu_seqlens_q`, grid over the host-known `fb.max_q`).
  * keys: kv indices 0..kv_len-1 through the block table; the loop bound is read from `kv_lens`
    on the device, so nothing depends on host-side kv lengths: `plan` only keeps references to
    fb tensors and `forward` is CUDA-graph capturable (the grid depends on B, width / max_q, and
    the split count, which depends on host-known sizes only).
  * visibility exactly as TorchRefBackend (forward_batch.py): causal or custom mask; uniform
    padding rows (i >= q_len) see kv index 0 only.
  * split-KV (flash-decoding) for uniform phases that launch too few programs to fill the GPU
    (e.g. decode / verify at small batch): each split covers 1/num_splits of the tile's kv range
    (chunk computed on the device) and `combine_splits` merges partial outputs by log-sum-exp.
  * fp32 / fp16 / bf16; fp32 accumulation; output in q's dtype. fp32 dots use
    input_precision="ieee" (no tf32), so fp32 results match the reference closely.

KV store: not the backend's. On CUDA the model's fused_kernels.rope_store rotates and stores the
step's K/V (padding rows point at the trash slot), or, at decode and a verify of one query tile
(the RoPE fold), the attention kernel does (`folds_rope`); elsewhere base.store_kv's
`index_copy_` calls do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from hotspec.core.forward_batch import ForwardBatch, ForwardMode
from hotspec.layers import pdl
from hotspec.layers.attention.base import AttentionBackend, RopeFold
from hotspec.layers.attention.merge_kernels import combine_splits, combine_splits_seq
from hotspec.layers.attention.triton_kernels import is_interpreted, paged_attn_fwd
from hotspec.layers.attention.tuning import KernelTuning, det_kv_chunk

__all__ = ["KernelTuning", "TritonBackend", "det_kv_chunk"]

_LOG2E = 1.4426950408889634


@dataclass
class TritonPlan:
    q_lens: torch.Tensor  # [B]
    kv_lens: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, max_blocks], unit stride along blocks
    cu_seqlens_q: torch.Tensor | None  # [B+1] ragged only
    custom_mask: torch.Tensor | None  # [B, width, M] uint8 view of the bool mask, or [B, width]
    width: int | None  # None: ragged                                # int64 words (mask_bits)
    max_q: int
    max_kv: int  # host-side bound, only used to choose the split count
    mask_bits: bool = False  # custom_mask packed: bit j of row i's word = mask[i, j] (M <= 64)
    m_custom: int = 0  # M, the custom mask's width
    tree_positions: torch.Tensor | None = None  # deterministic verify: [T] the nodes' positions


# Split counts. Decode (one query row per request) aims at two waves of programs: more, shorter
# programs, and its combine reads one row per head; a split keeps at least SPLIT_BLOCKS kv tiles
# of the static context bound. The phases of several query rows per request (verify, draft,
# draft_extend) aim at one wave (SMs // programs), and each split covers at least `min_chunk`
# kv indices of the live length (one kv tile per 16 rows of the query tile: the combine reads
# every live split's partial row for each of t x Hq rows, so taller tiles take fewer, longer
# splits); the splits past the live length do no work, and the combine skips them.
SPLIT_BLOCKS = 4


def min_chunk(block_m: int, block_n: int) -> int:
    """The fewest kv indices a split of a several-row phase covers (see SPLIT_BLOCKS' comment)."""
    return block_n * max(1, block_m // 16)


# Custom masks (verify, draft) of <= 64 slots travel as one int64 word per query row instead of a
# byte per (row, slot), which makes verify's attention faster; wider masks use the bytes.
MASK_BITS_MAX = 64  # tree slots one word holds


def pack_mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """[B, W, M] bool (M <= 64) -> [B, W] int64, bit j = mask[..., j]. Distinct powers of two sum
    to their OR; bit 63's term wraps to the sign bit, which is its two's-complement pattern."""
    m = mask.shape[-1]
    if m > MASK_BITS_MAX:
        raise ValueError(f"a packed mask holds at most {MASK_BITS_MAX} slots, got {m}")
    shifts = torch.arange(m, dtype=torch.int64, device=mask.device)
    return (mask.to(torch.int64) << shifts).sum(-1)


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


class TritonBackend(AttentionBackend):
    def __init__(self, block_size: int, tuning: KernelTuning | None = None) -> None:
        t = tuning or KernelTuning()
        if t.deterministic:
            t = KernelTuning(block_n=t.block_n, block_m=t.block_m or 16, num_splits=t.num_splits,
                             num_warps=t.num_warps or 4, num_stages=t.num_stages or 2,
                             deterministic=True, kv_chunk=t.kv_chunk)
            if t.kv_chunk % (t.block_n or 64) or t.kv_chunk % 32:
                raise ValueError(f"kv_chunk {t.kv_chunk}: a multiple of the kv tile "
                                 f"({t.block_n or '64 (32 in fp32)'})")
        self.deterministic, self.kv_chunk = t.deterministic, t.kv_chunk
        self.block_size = block_size
        self.mask_bits, self.fold_rope, self.min_chunk = t.mask_bits, t.fold_rope, t.min_chunk
        self.block_n, self.block_m, self.num_splits = t.block_n, t.block_m, t.num_splits
        self.num_warps, self.num_stages = t.num_warps, t.num_stages
        self._sm_count: dict[int, int] = {}
        self._interp = is_interpreted()

    # -- plan ---------------------------------------------------------------------------------
    def plan(self, fb: ForwardBatch) -> None:
        bt = fb.block_tables
        if bt.stride(1) != 1:
            bt = bt.contiguous()
        cm = fb.custom_mask
        bits, m_custom = False, 0
        if cm is not None:
            if fb.width is None:
                raise ValueError("custom_mask needs a uniform layout (width)")
            m_custom = cm.shape[2]
            if self.mask_bits and m_custom <= MASK_BITS_MAX:
                cm, bits = pack_mask_bits(cm.bool()), True
            elif cm.dtype == torch.bool:
                cm = cm.view(torch.uint8)
        if fb.width is None and fb.cu_seqlens_q is None:
            raise ValueError("ragged batch without cu_seqlens_q")
        tree = None
        if self.deterministic and fb.mode is ForwardMode.VERIFY and cm is not None:
            if not bits:
                raise ValueError(f"deterministic mode: a verify tree of at most {MASK_BITS_MAX} "
                                 f"nodes, got {m_custom} (lower --speculative-num-draft-tokens)")
            if fb.width != m_custom:
                raise ValueError(f"a verify batch's rows are its tree's nodes: width {fb.width}, "
                                 f"mask of {m_custom} slots")
            tree = fb.positions
        fb.attn_meta = TritonPlan(fb.q_lens, fb.kv_lens, bt, fb.cu_seqlens_q, cm, fb.width,
                                  int(fb.max_q), int(fb.max_kv), bits, m_custom, tree)

    # -- launch configuration -----------------------------------------------------------------
    def _sms(self, dev: torch.device) -> int:
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx not in self._sm_count:
            self._sm_count[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        return self._sm_count[idx]

    def _block_n(self, p: TritonPlan, is_fp32: bool, programs: int, dev: torch.device) -> int:
        """kv rows per tile: the constructor's block_n, else 32 in fp32; in 16 bits 32 for a decode
        batch (one row per request) of at most SMs // 16 programs before splitting (8 on the
        H200: the 8B heads at batch 1), else 64. A decode program at batch 1 owns one tile of the
        kv range (the split count follows the static bound), and its time is that tile's serial
        work, which a smaller tile shortens; with more programs the larger tile is faster."""
        if self.block_n:
            return self.block_n
        if self.deterministic:
            return 32 if is_fp32 else 64
        if is_fp32:
            return 32
        if p.width == 1 and dev.type == "cuda" and programs <= self._sms(dev) // 16:
            return 32
        return 64

    def _splits(self, p: TritonPlan, programs: int, block_m: int, block_n: int,
                dev: torch.device) -> int:
        if p.width is None:
            return 1
        if self.deterministic:  # programs a row's chunks share (each chunk's partial is its own)
            chunks = self._chunks(p)
            if self.num_splits is not None:
                return min(chunks, max(1, self.num_splits))
            if dev.type != "cuda":
                return chunks
            return min(chunks, triton.cdiv(2 * self._sms(dev), programs))
        if self.num_splits is not None:
            return max(1, self.num_splits)
        if dev.type != "cuda":
            return 1
        sms = self._sms(dev)
        if programs >= sms or p.max_kv < 4 * block_n:
            return 1
        if p.width == 1:  # decode: two waves (see SPLIT_BLOCKS' comment)
            want = triton.cdiv(2 * sms, programs)
            by_len = max(1, p.max_kv // (SPLIT_BLOCKS * block_n))
        else:  # several rows per request: one wave, splits of at least min_chunk live indices
            want = sms // programs
            by_len = max(1, p.max_kv // min_chunk(block_m, block_n))
        return max(1, min(want, by_len, 64))

    def _chunks(self, p: TritonPlan) -> int:
        """The deterministic mode's chunks of a uniform phase's rows (the partials' count): of
        the static bound, so the count follows no batch; 0 otherwise."""
        if not self.deterministic or p.width is None:
            return 0
        return triton.cdiv(max(p.max_kv, 1), self.kv_chunk)

    def _min_chunk(self, p: TritonPlan, splits: int, block_m: int, block_n: int) -> int:
        """The kernel's MIN_CHUNK: min_chunk for the automatic splits of a several-row phase, else
        0 (equal shares of the live length: decode, and a forced split count)."""
        if splits == 1 or self.deterministic:
            return 0
        if self.min_chunk is not None:
            return self.min_chunk
        if p.width == 1 or self.num_splits is not None:
            return 0
        return min_chunk(block_m, block_n)

    def _stages(self, p: TritonPlan) -> int:
        """Pipeline stages of the kv loop: the constructor's, else 1 for decode (one row per
        request, no custom mask) and 2 otherwise. A decode program at small batch owns one or
        two tiles, so a prefetch stage only adds its prologue."""
        if self.num_stages is not None:
            return self.num_stages
        return 1 if p.width == 1 and p.custom_mask is None else 2

    def _v_early(self, p: TritonPlan, block_n: int) -> bool:
        """Whether the kv loop issues each V tile's loads right after its K tile's: at one
        pipeline stage (nothing else moves them ahead; without it the SASS issues V's loads
        after the scores' and the softmax's barriers, a second memory round trip per tile) and
        with tiles of at most 32 rows (the batch-1 decode tile; V's registers are then live
        during the scores). The 64-row tiles of larger batches do not gain from it and keep V's
        loads after the softmax."""
        return self._stages(p) == 1 and block_n <= 32 and not self.deterministic

    def folds_rope(self, fb: ForwardBatch, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether `forward(..., rope=...)` should do RoPE and the KV store for this batch (q
        [T, Hq, D], the step's k [T, Hkv, D]): with fold_rope (the default), a decode-like batch
        (one row per request, no custom mask), and outside the deterministic mode a verify batch
        whose rows are its tree's nodes and fit one query tile (then no other program of the
        request reads the keys a program stores: SmolLM2's and the 8B's verify up to 16 nodes).
        The kernel then rotates q itself and stores the step's K and V, bit for bit as
        fused_kernels.rope_store would, which saves that kernel per layer."""
        if not self.fold_rope or fb.width is None:
            return False
        if fb.custom_mask is None:
            return fb.width == 1
        if self.deterministic or fb.mode is not ForwardMode.VERIFY \
                or fb.custom_mask.shape[-1] != fb.width:
            return False
        return self._tiles(fb.width, q.shape[1] // k.shape[1], q.dtype == torch.float32,
                           False)[3] == 1

    def _tiles(self, rows: int, group: int, is_fp32: bool, one_row: bool
               ) -> tuple[int, int, int, int]:
        """(block_m, the padded group, query rows a tile holds, query tiles) for `rows` query
        rows a request: the query heads of a kv head fill a tile's rows (group padded to a power
        of two), up to 64 rows (32 in fp32) or the constructor's block_m; one_row (the
        deterministic mode's tree verify, TREE_SEQ: each node reads its own keys): one query row
        a tile."""
        gp = _pow2(group)
        if self.block_m is not None:
            block_m = self.block_m
        else:
            block_m = min(32 if is_fp32 else 64, _pow2(rows * gp))
        block_m = max(16, block_m, gp)
        if one_row:
            gp = block_m  # one query row per program (a verify tile: one tree node's keys)
        block_q = block_m // gp
        return block_m, gp, block_q, triton.cdiv(max(rows, 1), block_q)

    # -- forward ------------------------------------------------------------------------------
    def forward(self, fb: ForwardBatch, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, scale: float, out: torch.Tensor | None = None, *,
                rope: RopeFold | None = None, before_resident: bool = False) -> torch.Tensor:
        """As AttentionBackend.forward; `out` ([T, Hq, D], q's dtype) is written if given. With
        `rope` (only where `folds_rope`), q is unrotated: the kernel rotates it, and rotates and
        stores the step's K and V into their cache slots first, as fused_kernels.rope_store.
        `before_resident`: the attention and its split combine are PDL-launched at one row too, so
        the resident o_proj's programs launch (and load their weights) while the attention runs:
        each kernel signals at its start that the next may launch, then waits for the one before."""
        p: TritonPlan = fb.attn_meta
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        if hq % hkv != 0:
            raise ValueError(f"{hq} query heads not a multiple of {hkv} kv heads")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"unsupported q dtype {q.dtype}")
        if q.stride(2) != 1:
            q = q.contiguous()
        if k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
            raise ValueError("KV cache must be contiguous along head_dim")
        group = hq // hkv
        is_fp32 = q.dtype == torch.float32
        b = p.q_lens.shape[0]
        rows = p.max_q if p.width is None else p.width
        block_m, gp, block_q, q_blocks = self._tiles(rows, group, is_fp32,
                                                     p.tree_positions is not None)
        block_n = self._block_n(p, is_fp32, q_blocks * b * hkv, q.device)
        splits = self._splits(p, q_blocks * b * hkv, block_m, block_n, q.device)

        if out is None:
            out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
        elif out.shape != (t, hq, d) or out.dtype != q.dtype or out.stride(2) != 1:
            raise ValueError("out must be [T, Hq, D] in q's dtype, contiguous along head_dim")
        if rope is not None and not self.folds_rope(fb, q, rope.k):
            raise ValueError("attention with RoPE folded in: decode batches (width 1, no custom "
                             "mask) and verify batches of one query tile only, with fold_rope "
                             "on; check folds_rope first")
        if t == 0 or b == 0:
            return out
        if p.width is not None and t != b * p.width:
            raise ValueError(f"uniform layout expects {b} * {p.width} rows, got {t}")
        ragged = p.width is None
        cu = p.cu_seqlens_q if ragged else p.q_lens
        custom = p.custom_mask is not None
        cm = p.custom_mask if p.custom_mask is not None else p.q_lens
        if p.mask_bits:
            cm_strides: tuple[int, ...] = (cm.stride(0), cm.stride(1), 0)
        else:
            cm_strides = tuple(cm.stride()) if custom else (0, 0, 0)
        m_custom = p.m_custom
        chunks = self._chunks(p) if splits > 1 else 0
        parts = chunks or splits  # (the deterministic mode: a partial per chunk)
        if splits > 1:
            opart = torch.empty((parts, t, hq, d), dtype=torch.float32, device=q.device)
            lse = torch.empty((parts, t, hq), dtype=torch.float32, device=q.device)
        else:
            opart = lse = out
        # 4 warps measured best on H200 for every phase (8 warps: ~2x slower prefill / verify)
        num_warps = self.num_warps or 4
        use_pdl, pdl_wait = pdl.enabled(q.device), pdl.chained(q.device, t, before_resident)
        launch = pdl.launch_kwargs(q.device, t, before_resident)
        grid = (q_blocks * splits, b, hkv)
        paged_attn_fwd[grid](
            q, k_cache, v_cache, out, p.block_tables, p.kv_lens, p.q_lens, cu, cm, opart, lse,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
            p.block_tables.stride(0), *cm_strides,
            opart.stride(0), opart.stride(1), opart.stride(2), lse.stride(0), lse.stride(1),
            float(scale) * _LOG2E, p.width or 0, m_custom, splits, chunks,
            GROUP=group, GROUP_PAD=gp, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_D=_pow2(d), HEAD_DIM=d, PAGE=self.block_size,
            RAGGED=ragged, CUSTOM=custom, SPLIT=splits > 1, F32_DOT=is_fp32 or self._interp,
            MASK_BITS=p.mask_bits, PDL=use_pdl, PDL_WAIT=pdl_wait, V_EARLY=self._v_early(p, block_n),
            MIN_CHUNK=self._min_chunk(p, splits, block_m, block_n),
            DET_CHUNK=self.kv_chunk if self.deterministic else 0,
            **_rope_kwargs(rope, k_cache), **self._tree_kwargs(p),
            num_warps=num_warps, num_stages=self._stages(p), **launch,
        )
        if splits > 1:
            comb_wait = pdl.chained(q.device, t, before_resident)
            args = (opart, lse, out, opart.stride(0), opart.stride(1), opart.stride(2),
                    lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), parts)
            kw = dict(HEAD_DIM=d, BLOCK_S=_pow2(parts), BLOCK_D=_pow2(d), PDL=use_pdl,
                      PDL_WAIT=comb_wait, **({"launch_pdl": True} if comb_wait else {}))
            if self.deterministic:
                combine_splits_seq[(t, hq)](*args, GROUP_S=8, num_warps=1, **kw,
                                            **self._tree_kwargs(None))
            else:
                combine_splits[(t, hq)](*args, num_warps=4, **kw)
        return out


    def _tree_kwargs(self, p: TritonPlan | None) -> dict[str, object]:
        """The deterministic mode's launch options: TREE_SEQ with the nodes' positions for a
        verify batch, and no FMA contraction anywhere (a contraction the compiler chooses per
        specialization could round one phase's row otherwise than another's)."""
        if not self.deterministic:
            return {}
        kw: dict[str, object] = {} if self._interp else {"enable_fp_fusion": False}
        if p is not None and p.tree_positions is not None:
            kw.update(TREE_SEQ=True, POS=p.tree_positions)
        return kw


def _rope_kwargs(rope: RopeFold | None, k_cache: torch.Tensor) -> dict[str, object]:
    if rope is None:
        return {}
    k, v = rope.k, rope.v
    if k.stride(2) != 1 or v.stride(2) != 1 or rope.cos.stride(1) != 1 \
            or rope.sin.stride() != rope.cos.stride():
        raise ValueError("RoPE fold: k, v, cos and sin need unit stride along the head dim")
    if k.dtype != k_cache.dtype or v.dtype != k_cache.dtype:
        raise ValueError("RoPE fold: k and v in the cache's dtype only")
    return dict(ROPE=True, KN=k, VN=v, POS=rope.positions.contiguous(), LOC=rope.loc.contiguous(),
                COS=rope.cos, SIN=rope.sin, stride_knt=k.stride(0), stride_knh=k.stride(1),
                stride_vnt=v.stride(0), stride_vnh=v.stride(1), stride_cs=rope.cos.stride(0))
