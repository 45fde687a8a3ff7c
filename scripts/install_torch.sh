#!/usr/bin/env bash
# Installs the CPU build of torch before the project, so that resolving the project's
# `torch==2.13.0` pin never pulls the multi-GB CUDA build from PyPI.
set -euo pipefail
PY=${1:-.venv/bin/python}
TORCH_VERSION=2.13.0
if "$PY" -c "import torch" 2>/dev/null; then
    exit 0
fi
# A wheel on local disk (pip's find-links) first, then its dependencies from the index;
# otherwise PyTorch's CPU index.
if "$PY" -m pip install -q --no-index --no-deps "torch==${TORCH_VERSION}" 2>/dev/null; then
    "$PY" -m pip install -q "torch==${TORCH_VERSION}"
else
    "$PY" -m pip install -q "torch==${TORCH_VERSION}" \
        --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
fi
