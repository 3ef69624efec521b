"""ForwardBatch: the one structure that carries a phase's inputs from the scheduler to a model.

KV layout (who owns which region of a request's slot space; slots come from its block table):

    kv index:  0 ............ seq_len-1 | seq_len ............ seq_len+R-1
               committed tokens          | this step's scratch (R = reserve)
               (target and draft pools   | verify: tree node i -> seq_len+i
                share one block table)   | draft:  step j, branch b -> seq_len+j*topk+b
                                         | draft_extend: accepted token i -> seq_len+i

Target and draft KV pools are indexed by the same slots: the draft head's KV for position p is
at the same slot as the target's, in its own pool.

Attention visibility for request b with q_len queries and kv_len visible kv indices:
  * causal:  query i sees kv indices <= kv_len - q_len + i (prefill, decode, draft_extend);
  * custom:  kv indices < kv_len - M are all visible, the last M follow `custom_mask[b, i, :M]`
             (verify: M = num_draft_tokens; draft: M = topk * (num_steps - 1)).
Uniform phases (decode, verify, draft, draft_extend) lay tokens out as [B * width]; rows of a
request beyond its q_len are padding: they write KV to the trash slot and their outputs are unused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class ForwardMode(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    VERIFY = "verify"
    DRAFT = "draft"
    DRAFT_EXTEND = "draft_extend"


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long, RoPE positions (tree depth for verify/draft)
    out_cache_loc: torch.Tensor  # [T] long, KV slot each token writes (trash slot for padding)
    q_lens: torch.Tensor  # [B] long, real queries per request
    kv_lens: torch.Tensor  # [B] long, visible kv indices per request, this step's tokens included
    block_tables: torch.Tensor  # [B, max_blocks] int32
    width: int | None = None  # tokens per request in uniform layouts; None for ragged prefill
    cu_seqlens_q: torch.Tensor | None = None  # [B+1] for ragged prefill
    max_q: int = 1  # host-side bounds for padding (known to the scheduler, no sync)
    max_kv: int = 1
    custom_mask: torch.Tensor | None = None  # [B, width, M] bool
    hidden_in: torch.Tensor | None = None  # draft heads: [T, F] target feature or own hidden
    attn_meta: Any = field(default=None, repr=False)  # filled by the attention backend's plan()

    @property
    def batch_size(self) -> int:
        return self.q_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
