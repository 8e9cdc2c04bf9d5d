#!/usr/bin/env bash
# The wheel folder a GPU machine without network needs to run `zero-train gpu-check` from this checkout, when
# it has the NVIDIA driver, CUDA torch, transformers, peft and accelerate but no DeepSpeed (and no datasets:
# the offline default corpus trains without it, zero_train.hf.prepare). For CPython 3.12 on x86-64 Linux.
#   bash scripts/gpu_wheels.sh                 # into runs/gpu_wheels/ (prints its size; needs the registry)
#   bash scripts/gpu_wheels.sh DIR
# Then, on the GPU machine, from the checkout:
#   ZT_WHEELS=DIR bash scripts/gpu_check.sh    # pip install --no-index --find-links DIR deepspeed ..., then the check
# DeepSpeed has no binary wheel on the registry: `pip wheel --no-deps --no-build-isolation` in this venv builds
# a pure one (its CUDA ops are compiled at first use on the GPU machine, or not at all: gpu-check needs none).
# Its dependencies the image lacks are fetched as cp312 manylinux wheels, at this venv's versions.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_wheels}
python=${ZT_PYTHON:-.venv/bin/python}
# DeepSpeed's requirements not on such an image (numpy, packaging, psutil, tqdm come with torch, transformers,
# accelerate), pydantic's own, and typing-extensions at the version pydantic needs
packages=(hjson ninja py-cpuinfo msgpack einops pydantic pydantic-core annotated-types typing-inspection
  typing-extensions)
mkdir -p "$out"
version() { "$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
"$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$out" "deepspeed==$(version deepspeed)"
pins=()
for package in "${packages[@]}"; do pins+=("$package==$(version "$package")"); done
"$python" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d "$out" "${pins[@]}"
ls -1 "$out"
echo "gpu_wheels: $(du -sb "$out" | cut -f1) bytes in $out ($(ls "$out" | wc -l) wheels)"
