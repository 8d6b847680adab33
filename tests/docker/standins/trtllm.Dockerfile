# CI's stand-in for TensorRT-LLM's release image (GPU-only, not pullable here), on which
# docker/trtllm/Dockerfile is built and run: the system Python, as in the real image, with the
# tests' faithful fake of the LLM API installed as the `tensorrt_llm` package (and the submodules
# the adapter imports). Build context: tests/trtllm. Test-only: never a product base.
ARG PYTHON_IMAGE=local/debian:bookworm
FROM ${PYTHON_IMAGE}
RUN --mount=type=bind,target=/ctx \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir -q pyyaml \
 && pkg=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tensorrt_llm \
 && mkdir -p "$pkg/executor" \
 && cp /ctx/fake_trtllm/*.py "$pkg/" \
 && touch "$pkg/executor/__init__.py" \
 && for m in sampling_params disaggregated_params scheduling_params llmapi lora_helper executor/request; do \
        echo 'from tensorrt_llm import *  # noqa: F403' > "$pkg/$m.py"; done
