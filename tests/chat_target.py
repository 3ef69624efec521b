"""A tiny chat target for train-draft tests: a 64-token character vocabulary with a chat template.

Its layers are weak (std 0.1) next to a strong embedding and LM head, so greedy continuations are
mostly a function of the last few tokens and settle into short repeating patterns: a draft head
learns them in a few hundred CPU steps. Token ids: 0 <unk>, 1 <s>, 2 <|end|> (EOS, end of turn),
3 <|user|>, 4 <|assistant|>, then one id per character.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<unk>", "<s>", "<|end|>", "<|user|>", "<|assistant|>"]
CHARS = "abcdefghijklmnopqrstuvwxyz .,?!'0123456789ABCDEFGHIJKLMNOPQ"  # 59: a 64-token vocabulary
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
EOS = 2


def save_chat_target(path: Path) -> Path:
    """Write the tiny chat target (HF Llama weights + fast tokenizer) to `path`; seed 0."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one char, one token
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="<|end|>")
    fast.chat_template = TEMPLATE
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1,
                      eos_token_id=EOS)
    hf = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
        hf.model.embed_tokens.weight.normal_(0, 1.0)
        hf.lm_head.weight.normal_(0, 0.5)
    hf.save_pretrained(path)
    fast.save_pretrained(path)
    return path
