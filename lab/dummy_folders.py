"""Config + tokenizer folders of the default model and Qwen2.5-Coder-0.5B-Instruct, for
`--load-format dummy` runs on the device without carrying their GGUFs (lab/carry.sh):

    python3 lab/dummy_folders.py .data     # writes .data/dummy-smollm2, .data/dummy-qwen (~15 MB)
"""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from hotspec.models.loader import load_model_config, locate_checkpoint, resolve_model_path

for name, model in (("smollm2", None), ("qwen", "qwen2.5-coder-0.5b-instruct")):
    out = Path(sys.argv[1]) / f"dummy-{name}"
    if (out / "tokenizer.json").is_file():
        continue
    _, gguf = locate_checkpoint(resolve_model_path(model))
    out.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    a, b = load_model_config(gguf), load_model_config(out)
    assert a.num_hidden_layers == b.num_hidden_layers and a.vocab_size == b.vocab_size, (a, b)
    print(out, sum(f.stat().st_size for f in out.iterdir()) // 2**20, "MiB")
