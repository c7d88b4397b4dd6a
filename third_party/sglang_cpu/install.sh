#!/usr/bin/env bash
# Installs a CPU-only SGLang server into its own virtual environment (used only by the server
# subprocess that rubric_rl.rollout.sglang_server starts). Facts behind each step:
# ../../shared notes "sglang-on-cpu" — the sglang wheel pins a CUDA torch, so torch is installed
# first and held fixed by a constraints file, sglang itself goes in with --no-deps, and two small
# adapters (a stand-in sgl_kernel, a sitecustomize for torchvision's op schemas) bridge CPU gaps.
#
#   bash third_party/sglang_cpu/install.sh            # venv at $SGLANG_VENV (default .venv-sglang)
#   SGLANG_VENV=/tmp/sgl bash third_party/sglang_cpu/install.sh
#
# Idempotent: a stamp file records a hash of this recipe; a matching stamp plus a passing check
# skips the install.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${SGLANG_VENV:-$REPO/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
SGLANG_VERSION="0.5.23"
TORCHVISION_VERSION="0.28.0"
START=$(date +%s)

# The plain (non-CUDA) dependencies of sglang 0.5.23 that its text-generation server imports.
DEPS=(
  triton==3.8.0 aiohttp anthropic blobfile==3.0.0 build distro easydict einops fastapi gguf
  interegular IPython "llguidance>=1.7.6,<2" "mistral_common>=1.11.5" msgspec ninja numpy
  openai==2.8.0 openai-harmony==0.0.4 orjson packaging partial_json_parser pillow
  prometheus-client psutil pybase64 pydantic "python-dateutil<3" python-multipart pyzmq regex requests
  scipy sentencepiece==0.2.1 setproctitle soundfile==0.13.1 tiktoken tokenizers==0.23.2
  transformers==5.19.0 tqdm "uvicorn>=0.51" uvloop watchfiles xxhash zstandard safetensors
  huggingface_hub dill datasets compressed-tensors==0.18.0 xgrammar==0.2.7 numba==0.68.0
  apache-tvm-ffi==0.1.11 timm==1.0.25 modelscope pyarrow==25.0.1
)

STAMP="$VENV/.rubric_rl_sglang_cpu_stamp"
RECIPE_HASH="$(cat "$HERE/install.sh" "$REPO/tools/pip_retry.sh" \
  "$HERE"/sgl_kernel_stub/pyproject.toml \
  "$HERE"/sgl_kernel_stub/sgl_kernel/*.py "$HERE"/site/*.py | sha256sum | cut -d' ' -f1)"

check() {
  # torch must be the CPU build at the pinned version, and sglang must import with our adapters.
  PYTHONPATH="$HERE/site${PYTHONPATH:+:$PYTHONPATH}" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" - <<PY
import torch
assert torch.__version__.split("+")[0] == "$TORCH_VERSION", f"torch is {torch.__version__}, want $TORCH_VERSION"
assert torch.version.cuda is None and not torch.cuda.is_available(), "torch has CUDA; want the CPU build"
import sglang, sgl_kernel, torchvision  # noqa: F401
assert sglang.__version__ == "$SGLANG_VERSION", f"sglang is {sglang.__version__}"
assert getattr(sgl_kernel, "IS_RUBRIC_RL_STANDIN", False), "sgl_kernel is not our CPU stand-in"
print(f"sglang {sglang.__version__} / torch {torch.__version__} (CPU) OK")
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$RECIPE_HASH" ]] && check >/dev/null 2>&1; then
  echo "[sglang_cpu] $VENV is up to date (stamp matches); nothing to do"
  exit 0
fi

echo "[sglang_cpu] installing into $VENV"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
# Every install is retried on a broken-off download (tools/pip_retry.sh). Where a release lies in
# the machine's local mirror, the pins take that one (pyarrow 25.0.1; numba 0.68.0, whose llvmlite
# 0.50 is local where 0.65.1's llvmlite 0.47 was a 56 MB download. sglang's metadata asks for numba
# 0.65.1, so pip prints a conflict warning; only a multimodal image processor imports numba, and
# the real-server tests pass with 0.68.0).
# shellcheck source=../../tools/pip_retry.sh
. "$REPO/tools/pip_retry.sh"
pip_install() { pip_retry "[sglang_cpu]" "$VENV/bin/python" --quiet "$@"; }
pip_install --upgrade pip

CONSTRAINTS="$VENV/constraints-sglang-cpu.txt"
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"

# 1. torch first (the CPU wheel on this machine), then held fixed for every later step.
pip_install -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
# 2. sglang and torchvision without their dependency pins (CUDA torch, flashinfer, ...).
pip_install --no-deps "sglang==$SGLANG_VERSION" "torchvision==$TORCHVISION_VERSION"
# 3. their plain dependencies, torch still pinned.
pip_install -c "$CONSTRAINTS" "${DEPS[@]}"
# 4. the stand-in sgl_kernel (one CPU op in plain torch) and the torchvision schema shim.
#    Built from a temporary copy so no build/ or egg-info lands in the repository.
STUB_TMP="$(mktemp -d)"
trap 'rm -rf "$STUB_TMP"' EXIT
cp -r "$HERE/sgl_kernel_stub" "$STUB_TMP/"
pip_install --no-deps --force-reinstall "$STUB_TMP/sgl_kernel_stub"

check
echo "$RECIPE_HASH" >"$STAMP"
echo "[sglang_cpu] done in $(( $(date +%s) - START )) s"
