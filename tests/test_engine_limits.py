"""Engine limits the contract has no field for (a stop-string cap, a seed the engine cannot honour,
its one grammar backend, an explicit-candidate cap) live in the model card: the shared validation
refuses a request past them before acceptance, on both surfaces, and the wire never shows them."""

import dataclasses

import grpc
from fake_backend import default_card
from helpers import collect, expect_status, gen_request, rejection

from openengine_adapters import backend as be
from openengine_adapters.v1 import generation_pb2, input_pb2, model_pb2
from openengine_adapters.wire.v0_1.stub import V01Stub

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def limited_card() -> be.ModelCard:
    gen = default_card().generation
    gen = dataclasses.replace(
        gen, max_stop_strings=2, seed_refusal="this engine runs without deterministic sampling",
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
ACCEPTED = [dict(stopping=stops("a", "b", "a")), dict(guided=choice("xgrammar")), dict(response=candidates(1, 2))]


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
