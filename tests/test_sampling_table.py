"""The sampling table (openengine_adapters/sampling.py) drives validation and every engine's keywords."""

from __future__ import annotations

import grpc
import pytest
from helpers import expect_status, gen_request

from openengine_adapters import backend as be
from openengine_adapters.sampling import REAL_FIELDS, SAMPLING_FIELDS, set_sampling
from openengine_adapters.sglang.request_mapping import sampling_params
from openengine_adapters.v1 import generation_pb2 as g


def test_every_contract_sampling_field_is_in_the_table():
    contract = {f.name for f in g.SamplingParams.DESCRIPTOR.fields} - {"num_sequences"}
    assert {f.name for f in SAMPLING_FIELDS} == contract


def test_engines_get_their_own_keywords():
    p = be.GenerateParams(request_id="r", model="m", token_ids=(1,),
                          sampling=be.Sampling(temperature=0.5, min_p=0.1, seed=7))
    assert set_sampling(p, "vllm") == {"temperature": 0.5, "min_p": 0.1, "seed": 7}
    sp = sampling_params(p)
    assert (sp["temperature"], sp["min_p"], sp["sampling_seed"]) == (0.5, 0.1, 7) and "seed" not in sp


@pytest.mark.parametrize("field", REAL_FIELDS, ids=lambda f: f.name)
async def test_a_value_outside_its_range_is_refused_naming_the_rule(oe, field):
    bad = {"temperature": -1.0, "top_p": 0.0, "min_p": 1.5, "frequency_penalty": 3.0, "presence_penalty": -3.0,
           "repetition_penalty": 0.0}[field.name]
    assert not field.within(bad)
    r = gen_request(request_id="bad")
    setattr(r.sampling, field.name, bad)
    await expect_status(oe.stub.Generate(r), grpc.StatusCode.INVALID_ARGUMENT,
                        f"sampling.{field.name}: {field.rule}")
