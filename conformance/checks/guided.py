"""Guided decoding: every advertised mode constrains the output; every other mode is rejected."""

from __future__ import annotations

import json
import re

from conformance.context import G, json_prefix_ok
from conformance.registry import check, expect
from openengine_adapters.v1 import model_pb2

M = model_pb2.GuidedDecodingMode
CHOICES = ["yes", "no"]
REGEX = r"(yes|no)"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
EBNF = 'root ::= "yes" | "no"'
STRUCTURAL_TAG = json.dumps({
    "type": "structural_tag",
    "structures": [{"begin": "<ok>", "schema": {"type": "boolean"}, "end": "</ok>"}],
    "triggers": ["<ok>"],
})


def _guide(mode: int) -> G.GuidedDecoding:
    if mode == M.GUIDED_DECODING_MODE_JSON_SCHEMA:
        return G.GuidedDecoding(json_schema=json.dumps(SCHEMA))
    if mode == M.GUIDED_DECODING_MODE_REGEX:
        return G.GuidedDecoding(regex=REGEX)
    if mode == M.GUIDED_DECODING_MODE_EBNF_GRAMMAR:
        return G.GuidedDecoding(ebnf_grammar=EBNF)
    if mode == M.GUIDED_DECODING_MODE_STRUCTURAL_TAG:
        return G.GuidedDecoding(structural_tag=STRUCTURAL_TAG)
    if mode == M.GUIDED_DECODING_MODE_CHOICE:
        return G.GuidedDecoding(choice=G.ChoiceConstraint(choices=CHOICES))
    return G.GuidedDecoding(json_object=G.JsonObjectConstraint())


def _verify(mode: int, text: str, reason: int) -> None:
    length = reason == G.FINISH_REASON_LENGTH
    if mode in (M.GUIDED_DECODING_MODE_CHOICE, M.GUIDED_DECODING_MODE_EBNF_GRAMMAR):
        expect(text in CHOICES, f"output {text!r} is not one of {CHOICES}")
    elif mode == M.GUIDED_DECODING_MODE_REGEX:
        expect(re.fullmatch(REGEX, text), f"output {text!r} does not fullmatch {REGEX!r}")
    elif mode in (M.GUIDED_DECODING_MODE_JSON_OBJECT, M.GUIDED_DECODING_MODE_JSON_SCHEMA):
        try:
            value = json.loads(text)
        except ValueError:
            expect(length and json_prefix_ok(text),
                   f"output {text!r} is not JSON (finish {G.FinishReason.Name(reason)})")
            return
        expect(isinstance(value, dict), f"output {text!r} is not a JSON object")
        if mode == M.GUIDED_DECODING_MODE_JSON_SCHEMA:
            expect(set(value) == {"ok"} and isinstance(value["ok"], bool),
                   f"output {text!r} does not satisfy the schema {SCHEMA}")
    # STRUCTURAL_TAG: the free text between tags is unconstrained; acceptance and a well-formed stream suffice


def _guided_check(mode: int):
    name = M.Name(mode).removeprefix("GUIDED_DECODING_MODE_").lower()

    @check(f"guided.{name}", f"advertised guided_decoding {name.upper()} (else rejected)")
    async def run(ctx):
        ctx.require_generation()
        cap = ctx.gen_caps().guided_decoding
        req = ctx.request(f"guided-{name}", max_tokens=48, guided=_guide(mode),
                          sampling=G.SamplingParams(temperature=0.0))
        if not (cap.supported and mode in cap.modes):
            await ctx.gen_rejected(req, what=f"guided {name} (not advertised)")
            return
        text, _, fin = (await ctx.run(req)).only()
        _verify(mode, text, fin.reason)

    return run


for _mode in (M.GUIDED_DECODING_MODE_JSON_SCHEMA, M.GUIDED_DECODING_MODE_REGEX, M.GUIDED_DECODING_MODE_EBNF_GRAMMAR,
              M.GUIDED_DECODING_MODE_STRUCTURAL_TAG, M.GUIDED_DECODING_MODE_CHOICE,
              M.GUIDED_DECODING_MODE_JSON_OBJECT):
    _guided_check(_mode)
