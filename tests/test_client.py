"""The bundled client (fail-closed revision check) and the gateway reranking helper."""

from __future__ import annotations

import pytest
from helpers import gen_request

from openengine_adapters import schema
from openengine_adapters.client import IncompatibleServer, NotOnSurface, OpenEngineClient, check_compatible
from openengine_adapters.rerank import NotRankable, rerank
from openengine_adapters.v1 import engine_pb2, scoring_pb2, tasks_pb2


async def test_client_connects_and_calls(oe):
    async with OpenEngineClient(oe.target) as client:
        assert client.engine_info.schema_revision == 1
        events = [r async for r in client.generate(gen_request("hi"))]
        assert events[-1].HasField("usage")
        assert (await client.get_model_info("tiny")).served_model_name == "tiny"
        assert (await client.health()).state
        assert [d.state async for d in client.drain(stop_accepting_new_requests=False)][-1] == 3
        with pytest.raises(ValueError):
            await client.abort()


def info(**kw):
    fields = dict(schema_revision=1, minimum_client_revision=1, schema_release=schema.SCHEMA_RELEASE)
    fields.update(kw)
    return engine_pb2.EngineInfo(**fields)


@pytest.mark.parametrize("bad,fragment", [
    (info(schema_revision=0), "invalid"),
    (info(schema_revision=2), "outside"),
    (info(minimum_client_revision=2), "requires client"),
    (info(schema_release="main"), "not a tested release"),
    (info(schema_release=""), "not a tested release"),
])
def test_client_fails_closed(bad, fragment):
    with pytest.raises(IncompatibleServer, match=fragment):
        check_compatible(bad)
    check_compatible(info())


async def test_client_refuses_incompatible_server(oe, monkeypatch):
    monkeypatch.setattr(schema, "SCHEMA_RELEASE", "main")
    client = OpenEngineClient(oe.target)
    with pytest.raises(IncompatibleServer):
        await client.connect()


async def test_client_on_the_v0_1_surface(oe):
    async with OpenEngineClient(oe.target, contract="v0.1.0") as client:
        assert client.engine_info.schema_release == schema.V0_1_SCHEMA_RELEASE
        events = [r async for r in client.generate(gen_request("hi", stopping={"max_tokens": 2}, priority=3))]
        assert events[-1].HasField("usage") and oe.fake.seen_params[-1].priority == 3
        mi = await client.get_model_info("tiny")
        assert mi.kv_block_size == 16, "capacity moved to ServerInfo is seen in its revision-1 place"
        assert (await client.get_load()).attributes["warm"] == "true"
        with pytest.raises(NotOnSurface, match="Drain"):
            client.drain()
        with pytest.raises(NotOnSurface, match="Embed"):
            await client.embed(None)


async def test_v0_1_client_fails_closed(oe, monkeypatch):
    monkeypatch.setattr(schema, "V0_1_SCHEMA_RELEASE", schema.SCHEMA_RELEASE)  # a release it was not tested with
    client = OpenEngineClient(oe.target, contract="v0.1.0")
    with pytest.raises(IncompatibleServer, match="not a tested release"):
        await client.connect()
    with pytest.raises(ValueError, match="contract"):
        OpenEngineClient(oe.target, contract="v2")


def score_response(values, higher=True, indexes=None):
    resp = scoring_pb2.ScoreResponse()
    if higher is not None:
        resp.higher_is_better = higher
    group = resp.groups.add(group_id="g", group_index=0)
    for i, v in enumerate(values):
        group.candidates.add(candidate_id=f"c{i}", candidate_index=i if indexes is None else indexes[i],
                             scores=tasks_pb2.DenseFloatTensor(shape=[len(v)], values=v))
    return resp


def test_rerank_stable_by_direction_ties_by_index_top_n():
    resp = score_response([[0.5], [0.9], [0.5], [0.1]])
    docs = ["a", "b", "c", "d"]
    ranked = rerank(resp, documents=docs)
    assert [r.candidate_index for r in ranked] == [1, 0, 2, 3]
    assert [r.document for r in ranked] == ["b", "a", "c", "d"]
    assert [r.candidate_index for r in rerank(score_response([[0.5], [0.9], [0.5]], higher=False))] == [0, 2, 1]
    assert [r.candidate_id for r in rerank(resp, top_n=2)] == ["c1", "c0"]
    assert rerank(resp, top_n=0) == []


@pytest.mark.parametrize("resp", [score_response([[0.5]], higher=None), score_response([[0.5, 0.1]])])
def test_rerank_refuses_unrankable(resp):
    with pytest.raises(NotRankable):
        rerank(resp)


@pytest.mark.parametrize("contract", ["revision-1", "v0.1.0"])
async def test_refusals_are_typed_errors_with_the_status_message_and_engine_error(oe, contract):
    """A refused call raises OpenEngineError (still a grpc.aio.AioRpcError) carrying the status, the
    message and the trailer's EngineError; an unknown model is NotFound; no server is ServerUnreachable."""
    import grpc

    from openengine_adapters.client import NotFound, OpenEngineError, ServerUnreachable
    from openengine_adapters.v1 import error_pb2

    async with OpenEngineClient(oe.target, contract=contract) as client:
        with pytest.raises(NotFound) as unknown:
            await client.get_model_info("nope")
        assert unknown.value.status == grpc.StatusCode.NOT_FOUND and "nope" in unknown.value.message
        assert unknown.value.engine_error.code == error_pb2.ERROR_CODE_MODEL_NOT_FOUND
        with pytest.raises(NotFound) as streamed:
            [r async for r in client.generate(gen_request("hi", model="nope"))]
        assert streamed.value.engine_error.code == error_pb2.ERROR_CODE_MODEL_NOT_FOUND
        with pytest.raises(OpenEngineError) as bad:
            [r async for r in client.generate(gen_request("hi", sampling={"temperature": -1}))]
        assert bad.value.status == grpc.StatusCode.INVALID_ARGUMENT and isinstance(bad.value, grpc.aio.AioRpcError)
        assert bad.value.engine_error is not None and "temperature" in bad.value.engine_error.message
    from helpers import free_port

    with pytest.raises(ServerUnreachable) as down:
        await OpenEngineClient(f"127.0.0.1:{free_port()}").connect(timeout=5)
    assert down.value.status == grpc.StatusCode.UNAVAILABLE and down.value.engine_error is None
