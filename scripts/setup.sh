#!/usr/bin/env bash
# Create (or reuse) the project virtual environment in .venv and install zero_train into it.
# Idempotent: re-running after the first time only re-installs when pyproject.toml changed.
#   bash scripts/setup.sh          # normally called by scripts/demo.sh and scripts/test.sh
#   ZT_SETUP_DEEPSPEED_OPS=0 bash scripts/setup.sh   # no DeepSpeed CPU op built now (the demo needs none)
# On a machine without an NVIDIA GPU, torch is pinned to a CPU build so that pip never pulls the
# multi-GB CUDA wheels; on a GPU machine it is held to the tested range (torch>=2.11,<2.14); set
# ZT_TORCH_SPEC to override (e.g. ZT_TORCH_SPEC="torch==2.13.0").
# Where PyPI's torch for this version is a CUDA build and you want CPU, add the CPU wheel index
# through ZT_TORCH_INDEX_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
# The venv's tools first, as in an activated venv: torch builds DeepSpeed's ops with the first `ninja` on PATH,
# and the ops must be built with the ninja every zero_train process loads them with, the venv's (pip's ninja
# 1.13 and a system ninja 1.11 each discard the other's build log and rebuild everything: docs/startup.md;
# zero_train/__init__.py puts the venv's first in every process, zero_train/runtime/extensions.py explains).
export PATH="$PWD/$VENV/bin:$PATH"

# DeepSpeed JIT-compiles its CPU ops the first time a process needs them: the shared-memory collectives
# every CPU rank of deepspeed.init_distributed loads and DeepSpeedCPUAdam for optimizer offload (build times:
# docs/startup.md#deepspeeds-cpu-ops). Built here once per venv (in $TORCH_EXTENSIONS_DIR, which importing
# zero_train sets to .venv/torch_extensions unless it is set), so that neither the first training run nor the
# test suite waits on a compiler.
build_deepspeed_cpu_ops() {
  has_gpu && return 0  # GPU machines: DeepSpeed builds its CUDA-side ops when first used
  [ "${ZT_SETUP_DEEPSPEED_OPS:-1}" = 0 ] && return 0  # asked not to: an op is JIT-built when a run first needs it
  # torch builds in $TORCH_EXTENSIONS_DIR/<op>/ (zero_train/__init__.py: .venv/torch_extensions by default).
  # Per venv: torch's JIT rebuilds an op whose compiler flags changed, and the flags name the venv's include
  # paths, so venvs sharing ~/.cache/torch_extensions rebuilt each other's ops inside the tests whenever they
  # alternated (docs/startup.md#deepspeeds-cpu-ops)
  # built, and up to date for the venv's ninja (ops built by another ninja would rebuild at their first load)
  "$VENV/bin/python" - <<'PY' && return 0
import sys

import zero_train  # noqa: F401  (sets TORCH_EXTENSIONS_DIR to this venv's)
from zero_train.runtime.extensions import built_ops, venv_ninja, would_rebuild

ops, ninja = built_ops(), venv_ninja()
fresh = ninja is not None and not any(would_rebuild(folder, ninja) for folder in ops.values())
sys.exit(0 if fresh and {"deepspeed_shm_comm", "cpu_adam"} <= set(ops) else 1)
PY
  local ops_start
  ops_start=$(date +%s)
  echo "[setup] building DeepSpeed's CPU ops (shared-memory collectives, CPUAdam) once for this venv, with its ninja"
  DS_ACCELERATOR=cpu "$VENV/bin/python" - <<'PY' >/dev/null 2>&1 || { echo "[setup] building DeepSpeed's CPU ops failed: run the lines above by hand to see the compiler's error" >&2; exit 1; }
import zero_train  # noqa: F401  (sets TORCH_EXTENSIONS_DIR to this venv's)
import deepspeed.ops
from deepspeed.accelerator import get_accelerator

for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
    builder = get_accelerator().create_op_builder(name)
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        builder.load()
PY
  echo "[setup] DeepSpeed's CPU ops built in $(( $(date +%s) - ops_start )) s"
}

stamp="$VENV/.zero_train-installed"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  build_deepspeed_cpu_ops
  exit 0
fi
start=$(date +%s)
if has_gpu; then
  torch_spec=${ZT_TORCH_SPEC:-torch>=2.11,<2.14}  # the range docs/gpu.md#torch-versions names, not the newest
else
  torch_spec=${ZT_TORCH_SPEC:-torch==2.13.0}
fi
index_args=()
if [ -n "${ZT_TORCH_INDEX_URL:-}" ]; then index_args=(--extra-index-url "$ZT_TORCH_INDEX_URL"); fi
echo "[setup] installing $torch_spec and zero_train (editable, with dev extras)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${index_args[@]}" "$torch_spec" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]" "$torch_spec" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -c "import torch, deepspeed, transformers, datasets, zero_train" 2>/dev/null \
  || { echo "[setup] install failed: see the pip output above" >&2; exit 1; }
echo "$want" > "$stamp"
echo "[setup] installed in $(( $(date +%s) - start )) s"
build_deepspeed_cpu_ops
