# CI's stand-in for SGLang's image (CUDA, not pullable here), on which docker/sglang/Dockerfile is
# built: the system Python, as in the real image, holding the same sglang release the manifest
# names. Only the package: its CUDA-only dependencies do not install here, so the image is checked
# for our layer, entrypoint and health check, not served. Test-only: never a product base.
ARG PYTHON_IMAGE=local/debian:bookworm
FROM ${PYTHON_IMAGE}
ARG SGLANG_VERSION=0.5.23
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir -q --no-deps "sglang==${SGLANG_VERSION}"
