from helpers import collect, gen_request
from stream_contract import check_generate_stream

from openengine_adapters.v1 import engine_pb2


async def test_generate_roundtrip(oe):
    req = gen_request("hi", request_id="r1")
    s = check_generate_stream(req, await collect(oe.stub, req))
    assert s.text[0] == ("hello world. " * 2)[:16]
    info = await oe.stub.GetEngineInfo(engine_pb2.GetEngineInfoRequest())
    assert info.schema_revision == 1
