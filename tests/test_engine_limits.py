"""Engine limits the contract has no field for (a stop-string cap, a seed the engine cannot honour,
its one grammar backend, an explicit-candidate cap) live in the model card: the shared validation
refuses a request past them before acceptance, on both surfaces, and the wire never shows them."""

import dataclasses

import grpc
from fake_backend import default_card
from google.protobuf import json_format
from helpers import collect, expect_status, gen_request, rejection

from openengine_adapters import backend as be
from openengine_adapters.types import ErrorCode
from openengine_adapters.v0_1 import model_pb2 as v01_model
from openengine_adapters.v0_1 import server_pb2 as v01_server
from openengine_adapters.v0_1.openengine_pb2_grpc import ControlStub as Control
from openengine_adapters.v1 import generation_pb2, input_pb2, model_pb2
from openengine_adapters.wire.v0_1.stub import V01Stub

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def limited_card() -> be.ModelCard:
    gen = default_card().generation
    gen = dataclasses.replace(
        gen, max_stop_strings=2,
        ignored_options=(be.IgnoredOption("seed", "this engine runs without deterministic sampling"),
                         be.IgnoredOption("repetition_penalty", "this sampler ignores it", (1.0,))),
        guided_decoding=dataclasses.replace(gen.guided_decoding, backend="xgrammar"),
        output_logprobs=dataclasses.replace(gen.output_logprobs, max_token_ids=2))
    return default_card(generation=gen)


def stops(*texts: str) -> generation_pb2.StoppingOptions:
    return generation_pb2.StoppingOptions(conditions=[generation_pb2.StopCondition(stop_text=t) for t in texts])


def candidates(*ids: int) -> generation_pb2.ResponseOptions:
    return generation_pb2.ResponseOptions(
        return_output_logprobs=True,
        output_candidates=generation_pb2.CandidateTokenSelection(token_ids=input_pb2.TokenIds(ids=list(ids))))


def choice(backend: str) -> generation_pb2.GuidedDecoding:
    return generation_pb2.GuidedDecoding(choice=generation_pb2.ChoiceConstraint(choices=["yes", "no"]), backend=backend)


REFUSED = [
    (dict(stopping=stops("a", "b", "c")), "stopping.conditions: at most 2 stop strings"),
    (dict(sampling=generation_pb2.SamplingParams(seed=7)),
     "sampling.seed: this engine runs without deterministic sampling"),
    (dict(guided=choice("outlines")),
     "guided.backend: 'outlines' differs from the engine's grammar backend 'xgrammar'"),
    (dict(response=candidates(1, 2, 3)), "response.output_candidates.token_ids: at most 2 ids"),
]
ACCEPTED = [dict(stopping=stops("a", "b", "a")), dict(guided=choice("xgrammar")), dict(response=candidates(1, 2)),
            dict(sampling=generation_pb2.SamplingParams(repetition_penalty=1.0))]  # the neutral value


async def test_engine_limits_in_the_card_refuse_before_acceptance_on_both_surfaces(serve):
    async with serve(cards=[limited_card()]) as h:
        for stub in (h.stub, V01Stub(h.channel)):
            for fields, message in REFUSED:
                exc = await expect_status(stub.Generate(gen_request("hi", **fields)), INVALID, message)
                assert rejection(exc) is not None or stub is not h.stub
            for fields in ACCEPTED:
                assert (await collect(stub, gen_request("hi", **fields)))[-1].HasField("finished")
        assert len(h.fake.seen_params) == 2 * len(ACCEPTED)  # no refused request reached the engine


async def test_engine_limits_stay_off_the_wire(serve):
    async with serve(cards=[limited_card()]) as h:
        info = await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))
        wire = info.SerializeToString()
    async with serve() as h:
        assert wire == (await h.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="tiny"))).SerializeToString()


IGNORED = dict(sampling=generation_pb2.SamplingParams(seed=7, repetition_penalty=1.3, temperature=0.5))


async def test_ignored_options_are_refused_by_default_and_advertised_in_model_info(serve):
    async with serve(cards=[limited_card()]) as h:
        v01 = V01Stub(h.channel)
        for stub in (h.stub, v01):
            exc = await expect_status(stub.Generate(gen_request("hi", **IGNORED)), INVALID, "sampling.")
            assert rejection(exc) is None or rejection(exc).code == ErrorCode.UNSUPPORTED_FEATURE
        info = await Control(h.channel).GetModelInfo(v01_model.GetModelInfoRequest(model="tiny"))
        extra = json_format.MessageToDict(info.extra)
        assert extra["ignored_options"] == {"sampling.seed": "this engine runs without deterministic sampling",
                                            "sampling.repetition_penalty": "this sampler ignores it"}
        assert extra["ignored_options_policy"] == "refuse"
        assert not h.fake.seen_params


async def test_ignore_policy_drops_them_on_v0_1_counts_each_and_says_it_once(serve, caplog):
    """--ignored-options ignore: the v0.1.0 request is served without the options (the engine never sees
    them), counted per option in GetLoad and Prometheus, logged once per option; revision 1 still refuses."""
    async with serve(cards=[limited_card()], config={"ignored_options": "ignore", "metrics": True}) as h:
        v01 = V01Stub(h.channel)
        for _ in range(2):
            assert (await collect(v01, gen_request("hi", **IGNORED)))[-1].HasField("finished")
            sampling = h.fake.seen_params[-1].sampling
            assert sampling.seed is None and sampling.repetition_penalty is None and sampling.temperature == 0.5
        load = await Control(h.channel).GetLoad(v01_server.GetLoadRequest())
        assert load.attributes["openengine.option_ignored.sampling.seed"] == 2
        assert load.attributes["openengine.option_ignored.sampling.repetition_penalty"] == 2
        from prometheus_client import REGISTRY

        assert REGISTRY.get_sample_value("openengine_options_ignored_total", {"option": "sampling.seed"}) == 2
        said = [r.getMessage() for r in caplog.records if "--ignored-options ignore" in r.getMessage()]
        assert len(said) == 2 and any("deterministic sampling" in m for m in said)
        await expect_status(h.stub.Generate(gen_request("hi", **IGNORED)), INVALID, "sampling.")
        info = await Control(h.channel).GetModelInfo(v01_model.GetModelInfoRequest(model="tiny"))
        assert json_format.MessageToDict(info.extra)["ignored_options_policy"] == "ignore"
