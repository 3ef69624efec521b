"""A GGUF's tokenizer, converted once and kept in the cache folder.

transformers rebuilds a GGUF's tokenizer from its metadata: it reads the file's whole vocabulary
and merges and converts them, work that grows with the vocabulary, and the server and engine
processes each load it at every start. The converted tokenizer is saved with
`save_pretrained` into `$XDG_CACHE_HOME/hotspec/tokenizers/` (by default `~/.cache/hotspec`) under
a key of the file (resolved path, size, modification time) and the converting transformers
version; later loads read that folder. A cache that cannot be written is said once (a warning),
and the tokenizer is then rebuilt at each start.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hotspec.models.packaged import cache_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("hotspec.models")
FORMAT = 1  # bump when what is saved changes
_warned: set[str] = set()


def cached_folder(gguf: Path) -> Path:
    """Where the converted tokenizer of `gguf` is (or goes)."""
    import transformers

    st = gguf.stat()
    key = f"{gguf.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}\0{FORMAT}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return cache_dir() / "tokenizers" / f"{gguf.stem}-{digest}"


def gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a GGUF file: from the cache when it was converted before."""
    from transformers import AutoTokenizer

    folder = cached_folder(gguf)
    if (folder / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as e:
            log.warning("the cached tokenizer in %s is unreadable (%s); converting %s again",
                        folder, e, gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _save(tok, folder)
    return tok


def _save(tok: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save into a fresh folder beside `folder`, then rename it into place: a reader never sees
    half a tokenizer, and of two processes saving at once one rename wins."""
    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        tok.save_pretrained(str(tmp))
        if folder.exists():  # another process was first: its copy is the same
            return
        os.replace(tmp, folder)
        tmp = None
    except OSError as e:
        if (folder / "tokenizer.json").is_file():  # another process renamed its copy first
            return
        where = str(folder.parent)
        if where not in _warned:
            _warned.add(where)
            log.warning("could not cache the converted tokenizer in %s (%s): each start converts "
                        "it again. Fix: set XDG_CACHE_HOME to a writable folder", where, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
