"""Run inside a network namespace by tests/test_security_netns.py: every RPC the operator policy
concerns, from a non-loopback peer; prints {call: status name} as JSON.

    python tests/netns_client.py TARGET ADAPTER_DIR [TOKEN]
"""

import asyncio
import json
import sys

from helpers import outcome

from openengine_adapters.security.channel import open_channel
from openengine_adapters.v1 import engine_pb2, generation_pb2, lifecycle_pb2, lora_pb2, openengine_pb2_grpc
from openengine_adapters.wire.v0_1.stub import V01Stub


async def status(call) -> str:
    return (await outcome(call))[0].name


async def main(target: str, adapter: str, token: str | None) -> dict[str, str]:
    every = lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())
    load = lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(lora_id=1, lora_name="ad", source_path=adapter))
    unload = lora_pb2.UnloadLoraRequest(lora_name="ad")
    async with open_channel(target, token=token) as channel:
        rev1, v01 = openengine_pb2_grpc.OpenEngineStub(channel), V01Stub(channel)
        calls = {
            "GetEngineInfo": lambda: rev1.GetEngineInfo(engine_pb2.GetEngineInfoRequest(), timeout=10),
            "Generate": lambda: rev1.Generate(generation_pb2.GenerateRequest(
                prompt="hi", stopping=generation_pb2.StoppingOptions(max_tokens=2)), timeout=10),
            "Abort(request_id)": lambda: rev1.Abort(lifecycle_pb2.AbortRequest(request_id="nope"), timeout=10),
            "Abort(all)": lambda: rev1.Abort(every, timeout=10),
            "Control/Abort(all)": lambda: v01.Abort(every, timeout=10),
            "LoadLora": lambda: rev1.LoadLora(load, timeout=10),
            "Control/UnloadLora": lambda: v01.UnloadLora(unload, timeout=10),
            "Control/LoadLora": lambda: v01.LoadLora(load, timeout=10),
            "UnloadLora": lambda: rev1.UnloadLora(unload, timeout=10),
            "Drain": lambda: rev1.Drain(lifecycle_pb2.DrainRequest(stop_accepting_new_requests=True, deadline_ms=0),
                                        timeout=10),
        }
        return {name: await status(make()) for name, make in calls.items()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))))
