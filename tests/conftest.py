from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter. The switch must be set before anything
# imports triton: importing transformers' model classes (test modules do, at collection) pulls in
# torch._dynamo and with it triton, and kernels defined after that would not be interpreted
# ("Cannot call @triton.jit'd outside of the scope of a kernel").
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite's caches (converted tokenizers, joined packaged models) go to a folder of its own, not
# the user's ~/.cache/hotspec; servers the tests start inherit it.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="hotspec-tests-cache-")

torch.manual_seed(0)
# Under pytest-xdist (`-n N`) the workers share the cores: one torch thread each, or their
# intra-op threads spin-wait on one another.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // max(1, _WORKERS))))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run lab/gpu_job.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module's tests (engine threads started meanwhile inherit it): tiny
    matmuls gain nothing from intra-op threads, which only spin-wait on shared cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from hotspec.models.default_model import default_model_path

    return Path(default_model_path())


@pytest.fixture(scope="session")
def smol_llm():
    """The embedded default model in float32 on CPU, shared by the whole session."""
    from hotspec import LLM

    return LLM(dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def hf_smol(default_gguf: Path):
    """transformers' own implementation on the same GGUF: the reference for parity tests."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(default_gguf.parent), gguf_file=default_gguf.name,
                                             dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module", params=[(3, 1, 4), (4, 8, 12)], ids=["chain-3-1-4", "tree-4-8-12"])
def spec(request: pytest.FixtureRequest):
    """The default model with its shipped head in float32 on CPU, a chain and a tree."""
    from hotspec import LLM

    steps, topk, ntok = request.param
    return LLM(dtype="float32", device="cpu", kv_cache_memory_gb=0.05, speculative_algorithm="EAGLE3",
               speculative_num_steps=steps, speculative_eagle_topk=topk,
               speculative_num_draft_tokens=ntok)
