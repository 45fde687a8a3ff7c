# syntax=docker/dockerfile:1.7
#
# The gateway image, and the model worker's (same package, other command).
#
#   docker build -t inference-gateway:0.1.0-cpu .                          # CPU (default)
#   docker build --build-arg VARIANT=cuda -t inference-gateway:0.1.0-cuda .  # CUDA
#
# cpu:  python slim; torch from PyTorch's CPU index (no multi-GB CUDA wheels); faiss-cpu.
# cuda: an nvidia/cuda runtime base with Python 3.11; torch's CUDA build from PyPI and
#       faiss-gpu (the project's `gpu` extra). For the worker, and for a gateway that embeds
#       and searches on a GPU.
#
# Both run as an unprivileged user (10001) with everything they write under /tmp and
# /var/lib/gateway, so the root filesystem can be mounted read-only.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04

# ---- where Python comes from, per variant ----------------------------------------------
FROM ${PYTHON_IMAGE} AS python-cpu
ENV PYTHON=/usr/local/bin/python3.11

FROM ${CUDA_IMAGE} AS python-cuda
# Ubuntu 22.04 ships Python 3.10; the deadsnakes archive has 3.11. (Its packages are not
# pinned: the archive keeps only the latest build of each.)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && apt-get purge -y --auto-remove gnupg software-properties-common \
    && rm -rf /var/lib/apt/lists/*
ENV PYTHON=/usr/bin/python3.11

# The stage above that VARIANT names (python-cpu or python-cuda), not an image.
# hadolint ignore=DL3006
FROM python-${VARIANT} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# ---- build: a virtual environment with the project and its pinned dependencies ---------
FROM base AS build
ARG VARIANT
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN "$PYTHON" -m venv /opt/venv && /opt/venv/bin/pip install pip==25.3
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
# torch first, so that resolving the project's `torch==2.13.0` finds it installed: the CPU
# build from PyTorch's index (2.13.0+cpu satisfies ==2.13.0), or PyPI's CUDA build.
RUN if [ "$VARIANT" = "cpu" ]; then \
        pip install -c constraints.txt "torch==${TORCH_VERSION}" \
            --index-url "$TORCH_CPU_INDEX" --extra-index-url https://pypi.org/simple; \
    else \
        pip install -c constraints.txt "torch==${TORCH_VERSION}"; \
    fi
# The dependencies that pyproject.toml declares (plus the `gpu` extra for cuda), in a layer
# of their own that changes to the source do not invalidate.
RUN python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + (p['optional-dependencies']['gpu'] if sys.argv[1] == 'cuda' else [])))" \
        "$VARIANT" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt
COPY gateway ./gateway
COPY cache ./cache
COPY backends ./backends
COPY warmpool ./warmpool
COPY common ./common
# Not editable: the image carries the installed package, not this source tree.
# faiss-cpu and faiss-gpu both install the `faiss` module; in the CUDA image only the GPU
# build may own it, so faiss-cpu goes and faiss-gpu's files are written again.
RUN if [ "$VARIANT" = "cpu" ]; then \
        pip install -c constraints.txt .; \
    else \
        pip install -c constraints.txt ".[gpu]" \
        && pip uninstall -y faiss-cpu \
        && pip install --no-deps --force-reinstall "faiss-gpu==1.15.1"; \
    fi \
    && python -c "import gateway.cli, backends.worker"
# The embedder's ONNX graph, exported next to the packaged model (the runtime user cannot
# write there; without it, the gateway would export one under cache.path at each start).
RUN if [ "$VARIANT" = "cpu" ]; then python -m cache.onnx_export; fi

# ---- runtime ----------------------------------------------------------------------------
FROM base AS runtime
ARG VARIANT
LABEL org.opencontainers.image.title="inference-gateway" \
      org.opencontainers.image.description="OpenAI-compatible inference gateway with a semantic cache (${VARIANT})" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --home-dir /var/lib/gateway \
        --no-create-home --shell /usr/sbin/nologin gateway \
    && install -d -o gateway -g gateway -m 0750 /var/lib/gateway /var/lib/gateway/weights \
    && install -d -m 0755 /etc/gateway
COPY --from=build /opt/venv /opt/venv
# A default configuration, so that `docker run` starts; Kubernetes mounts its own over it.
COPY config/example.yaml /etc/gateway/gateway.yaml
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/var/lib/gateway \
    GATEWAY_CONFIG=/etc/gateway/gateway.yaml \
    GATEWAY_DATA_DIR=/var/lib/gateway \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
WORKDIR /var/lib/gateway
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=2)"]
ENTRYPOINT ["gateway"]
CMD ["serve", "--config", "/etc/gateway/gateway.yaml"]
