"""An unmodified OpenEngine v0.1.0 client, as a router built on upstream's release would be.

It imports nothing of this project: its stubs are generated at start-up from the canonical,
unshifted protos (``proto/upstream-v0.1.0``, package ``openengine.v1``) into a temporary folder,
and it speaks only ``openengine.v1.Inference`` and ``openengine.v1.Control``. The checks follow
upstream's docs/api.md: discovery, health, load, a streamed generation (or a prefill handoff on a
PREFILL engine), and the spec's statuses with the ``openengine-error-bin`` EngineError for bad
input. Prints one line per check and a closing ``N passed, M failed``; exits non-zero on failure.

    python tests/v0_1_client.py --target 127.0.0.1:50051 [--model NAME] [--expect-engine vllm]
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import tempfile
import traceback

import grpc
import grpc_tools
from grpc_tools import protoc

PROTOS = pathlib.Path(__file__).resolve().parent.parent / "proto" / "upstream-v0.1.0"
RELEASE = "768a93c7b44e40f28c692ad0b471a8f2"
ERROR_TRAILER = "openengine-error-bin"


def load_stubs(out: pathlib.Path):
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "openengine" / "v1").glob("*.proto"))
    if protoc.main(["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
                    *protos]) != 0:
        raise SystemExit("protoc failed on the canonical v0.1.0 protos")
    sys.path.insert(0, str(out))
    names = ("error", "generation", "kv", "lifecycle", "lora", "model", "server", "openengine")
    pb = {n: importlib.import_module(f"openengine.v1.{n}_pb2") for n in names}
    return pb, importlib.import_module("openengine.v1.openengine_pb2_grpc")


class Checks:
    def __init__(self, args, pb, grpc_mod) -> None:
        self.args, self.pb = args, pb
        channel = grpc.insecure_channel(args.target)
        grpc.channel_ready_future(channel).result(timeout=args.timeout)
        self.inference = grpc_mod.InferenceStub(channel)
        self.control = grpc_mod.ControlStub(channel)
        self.passed: list[str] = []
        self.failed: list[str] = []

    def run(self, name, fn) -> None:
        try:
            fn()
        except Exception as exc:  # a failed check, reported and counted
            self.failed.append(name)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            print(f"FAIL {name}: {detail}", flush=True)
        else:
            self.passed.append(name)
            print(f"ok   {name}", flush=True)

    def rejected(self, call, code: grpc.StatusCode, error_code: int):
        try:
            result = call()
            if hasattr(result, "__iter__") and not hasattr(result, "SerializeToString"):
                events = list(result)
                raise AssertionError(f"expected {code}, got a stream of {len(events)} events")
            raise AssertionError(f"expected {code}, the call succeeded")
        except grpc.RpcError as exc:
            assert exc.code() == code, f"expected {code}, got {exc.code()}: {exc.details()}"
            values = [v for k, v in exc.trailing_metadata() or () if k == ERROR_TRAILER]
            assert values, f"{code} without the {ERROR_TRAILER} trailer"
            err = self.pb["error"].EngineError.FromString(values[0])
            assert err.code == error_code, f"EngineError code {err.code}, expected {error_code}: {err.message}"
            return err

    # ------------------------------------------------------------------ the checks

    def server_info(self):
        info = self.control.GetServerInfo(self.pb["server"].GetServerInfoRequest(), timeout=self.args.timeout)
        assert info.schema_release == RELEASE, f"schema_release {info.schema_release!r}"
        assert info.schema_revision == 1 and info.minimum_client_revision == 1
        assert info.engine_name and info.supported_models and info.instance_id
        if self.args.expect_engine:
            assert info.engine_name == self.args.expect_engine, info.engine_name
        assert info.HasField("capacity") and info.HasField("kv_connector") and info.kv_connector.HasField("enabled")
        self.info = info

    def model_info(self):
        model = self.args.model or self.info.supported_models[0]
        mi = self.control.GetModelInfo(self.pb["model"].GetModelInfoRequest(model=model), timeout=self.args.timeout)
        assert model in (mi.served_model_name, *mi.served_model_aliases) or mi.model_id == model
        self.model, self.mi = model, mi

    def unknown_model(self):
        self.rejected(lambda: self.control.GetModelInfo(self.pb["model"].GetModelInfoRequest(model="no-such-model"),
                                                        timeout=self.args.timeout),
                      grpc.StatusCode.NOT_FOUND, self.pb["error"].ERROR_CODE_MODEL_NOT_FOUND)

    def health(self):
        h = self.control.Health(self.pb["lifecycle"].HealthRequest(), timeout=self.args.timeout)
        assert h.state == self.pb["lifecycle"].HEALTH_STATE_READY, f"health state {h.state}"

    def load(self):
        load = self.control.GetLoad(self.pb["server"].GetLoadRequest(), timeout=self.args.timeout)
        assert load.instance_id == self.info.instance_id and load.HasField("timestamp_unix_nanos")

    def _request(self, max_tokens):
        gen = self.pb["generation"]
        return gen.GenerateRequest(model=self.model, prompt="Hello there",
                                   stopping=gen.StoppingOptions(max_tokens=max_tokens))

    def generate(self):
        role = self.info.engine_role
        server = self.pb["server"]
        metadata = [("openengine-routing-key", "v0.1.0-client"),
                    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
        if self.mi.generation.supports_priority:
            metadata.append(("openengine-priority", "1"))
        if role == server.ENGINE_ROLE_DECODE:
            return  # a decode engine needs a KV session from a prefill engine
        max_tokens = 1 if role == server.ENGINE_ROLE_PREFILL else 4
        events = list(self.inference.Generate(self._request(max_tokens), metadata=metadata,
                                              timeout=self.args.timeout))
        kinds = [e.WhichOneof("event") for e in events]
        assert "error" not in kinds, f"engine error: {events[-1].error.message}"
        assert events[-1].HasField("usage"), "usage belongs on the final response"
        if role == server.ENGINE_ROLE_PREFILL:
            assert kinds[-1] == "prefill_ready", kinds
            session = events[-1].prefill_ready.kv_session
            ack = self.control.Abort(self.pb["lifecycle"].AbortRequest(kv_session=session), timeout=self.args.timeout)
            assert ack.status == self.pb["lifecycle"].ABORT_STATUS_ABORTED
        else:
            assert kinds.count("finished") == 1 and kinds[-1] == "finished", kinds
            assert "token" in kinds and events[-1].usage.completion_tokens >= 1

    def bad_priority(self):
        self.rejected(lambda: list(self.inference.Generate(
            self._request(2), metadata=[("openengine-priority", "high")], timeout=self.args.timeout)),
            grpc.StatusCode.INVALID_ARGUMENT, self.pb["error"].ERROR_CODE_INVALID_ARGUMENT)

    def repeated_key(self):
        self.rejected(lambda: list(self.inference.Generate(
            self._request(2), metadata=[("openengine-routing-key", "a"), ("openengine-routing-key", "b")],
            timeout=self.args.timeout)),
            grpc.StatusCode.INVALID_ARGUMENT, self.pb["error"].ERROR_CODE_INVALID_ARGUMENT)

    def abort_unknown(self):
        self.rejected(lambda: self.control.Abort(self.pb["lifecycle"].AbortRequest(request_id="never-sent"),
                                                 timeout=self.args.timeout),
                      grpc.StatusCode.NOT_FOUND, self.pb["error"].ERROR_CODE_REQUEST_NOT_FOUND)

    def loras(self):
        request = self.pb["lora"].ListLorasRequest()
        if self.mi.supports_lora:
            self.control.ListLoras(request, timeout=self.args.timeout)
        else:
            self.rejected(lambda: self.control.ListLoras(request, timeout=self.args.timeout),
                          grpc.StatusCode.FAILED_PRECONDITION, self.pb["error"].ERROR_CODE_UNSUPPORTED_FEATURE)

    def kv_sources(self):
        try:
            resp = self.control.GetKvEventSources(self.pb["kv"].GetKvEventSourcesRequest(), timeout=self.args.timeout)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc.code()
            return
        for src in resp.sources:
            assert src.endpoint_addr.host not in ("", "*", "0.0.0.0", "::"), "a bind wildcard was advertised"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--expect-engine", default=None)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pb, grpc_mod = load_stubs(pathlib.Path(tmp))
        assert pb["generation"].GenerateRequest.DESCRIPTOR.full_name == "openengine.v1.GenerateRequest"
        checks = Checks(args, pb, grpc_mod)
        for name in ("server_info", "model_info", "unknown_model", "health", "load", "generate", "bad_priority",
                     "repeated_key", "abort_unknown", "loras", "kv_sources"):
            checks.run(name, getattr(checks, name))
    print(f"{len(checks.passed)} passed, {len(checks.failed)} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
