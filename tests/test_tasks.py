"""Embed / Classify / Score through real gRPC calls: success shapes, every rejection, broken engines.

Spec sections: "Non-generative task API", "Embedding", "Classification", "Scoring" and
"Task capability discovery" of spec/openengine-api-v1.md.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from itertools import pairwise

import grpc
import pytest
from fake_backend import EMBED_DIM, LABELS, FakeBackend, default_card, tokenize
from helpers import eventually, expect_status, rejection, serve_backend

from openengine_adapters import backend as be
from openengine_adapters.errors import EngineFailure
from openengine_adapters.types import (
    EmbeddingEncoding,
    ErrorCode,
    Feature,
    Granularity,
    Modality,
    ScoreNormalization,
    TaskInputType,
    ValueSemantics,
)
from openengine_adapters.v1 import (
    classification_pb2,
    embedding_pb2,
    input_pb2,
    lora_pb2,
    scoring_pb2,
    tasks_pb2,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INTERNAL = grpc.StatusCode.INTERNAL

SEQ = tasks_pb2.TASK_OUTPUT_GRANULARITY_SEQUENCE
TOK = tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN
DENSE = tasks_pb2.EMBEDDING_ENCODING_DENSE
SPARSE = tasks_pb2.EMBEDDING_ENCODING_SPARSE
PROBS = tasks_pb2.TASK_VALUE_SEMANTICS_PROBABILITIES
LOGITS = tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS
LOGPROBS = tasks_pb2.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES
SIMILARITY = tasks_pb2.TASK_VALUE_SEMANTICS_SIMILARITY
NORM_NONE = tasks_pb2.SCORE_NORMALIZATION_NONE
NORM_SOFTMAX = tasks_pb2.SCORE_NORMALIZATION_SOFTMAX

# --------------------------------------------------------------------------- request builders


def ctx(model: str = "tiny", rid: str = "task-1", **kw) -> tasks_pb2.TaskRequestContext:
    return tasks_pb2.TaskRequestContext(request_id=rid, model=model, **kw)


def text(item_id: str, s: str = "hello") -> tasks_pb2.TaskInput:
    return tasks_pb2.TaskInput(item_id=item_id, text=s)


def toks(item_id: str, ids) -> tasks_pb2.TaskInput:
    return tasks_pb2.TaskInput(item_id=item_id, token_ids=input_pb2.TokenIds(ids=ids))


def image(url: str = "https://example.com/cat.png", modality=input_pb2.MODALITY_IMAGE):
    return input_pb2.MediaItem(modality=modality, url=url)


def mm(item_id: str, media=(), **prompt) -> tasks_pb2.TaskInput:
    return tasks_pb2.TaskInput(item_id=item_id,
                               multimodal=tasks_pb2.MultimodalTaskInput(media=list(media), **prompt))


def embed_req(inputs=None, context=None, **opts) -> embedding_pb2.EmbedRequest:
    return embedding_pb2.EmbedRequest(
        context=context if context is not None else ctx(),
        inputs=[text("a")] if inputs is None else inputs,
        options=embedding_pb2.EmbedOptions(**opts))


def classify_req(inputs=None, context=None, **opts) -> classification_pb2.ClassifyRequest:
    return classification_pb2.ClassifyRequest(
        context=context if context is not None else ctx(),
        inputs=[text("a")] if inputs is None else inputs,
        options=classification_pb2.ClassifyOptions(**opts))


def group(gid: str = "g", query=None, cands=None) -> scoring_pb2.ScoreGroup:
    g = scoring_pb2.ScoreGroup(group_id=gid,
                               candidates=[text("c0", "world"), text("c1", "hello")] if cands is None
                               else cands)
    if query is not False:
        g.query.CopyFrom(text("q", "hello") if query is None else query)
    return g


def score_req(groups=None, context=None, **opts) -> scoring_pb2.ScoreRequest:
    return scoring_pb2.ScoreRequest(
        context=context if context is not None else ctx(),
        groups=[group()] if groups is None else groups,
        options=scoring_pb2.ScoreOptions(**opts))


def embed_without_context() -> embedding_pb2.EmbedRequest:
    return embedding_pb2.EmbedRequest(inputs=[text("a")])


# --------------------------------------------------------------------------- model cards

_BASE = default_card().tasks
_MM = (TaskInputType.TEXT, TaskInputType.TOKEN_IDS, TaskInputType.MULTIMODAL)


def _card(name: str, tasks, **kw) -> be.ModelCard:
    return default_card(model_id=f"fake/{name}", served_model_name=name, served_model_aliases=(),
                        tasks=tasks, **kw)


# Advertises the least: no explicit TOKEN/SPARSE/normalize/dimensions, one semantics, one
# normalization, no label-token scoring.
NARROW = _card("narrow", be.TaskSupport(
    embed=replace(_BASE.embed, granularities=(Granularity.SEQUENCE,),
                  encodings=(EmbeddingEncoding.DENSE,), supports_normalization=False,
                  supports_dimension_override=False),
    classify=replace(_BASE.classify, semantics=(ValueSemantics.PROBABILITIES,)),
    score=replace(_BASE.score, normalizations=(ScoreNormalization.NONE,),
                  supports_label_token_scoring=False)))
# Advertises multimodal inputs (images only), priority, LoRA and score instructions.
WIDE = _card("wide", be.TaskSupport(
    embed=replace(_BASE.embed, input_types=_MM, modalities=(Modality.IMAGE,),
                  supports_priority=True, supports_lora=True),
    classify=replace(_BASE.classify, input_types=_MM, modalities=(Modality.IMAGE,),
                     supports_priority=True, supports_lora=True),
    score=replace(_BASE.score, supports_instruction=True, supports_priority=True,
                  supports_lora=True)))
NO_TASKS = _card("no-tasks", None)
DISABLED = _card("disabled", be.TaskSupport(
    embed=replace(_BASE.embed, supported=False),
    classify=replace(_BASE.classify, supported=False),
    score=replace(_BASE.score, supported=False)))
UNREPORTED = _card("unreported", be.TaskSupport())


@pytest.fixture
async def multi(serve):
    """One server with the default card ("tiny") and the custom cards above."""
    async with serve(None, cards=[default_card(), NARROW, WIDE, NO_TASKS, DISABLED, UNREPORTED]) as h:
        yield h


def norm(values) -> float:
    return math.sqrt(sum(x * x for x in values))


# =========================================================================== embed success


async def test_embed_sequence_defaults(oe):
    req = embed_req([text("b", "hello"), toks("a", [1, 2, 3]), text("c", "xy")],
                    context=ctx(rid="emb-seq"))
    resp = await oe.stub.Embed(req)
    assert resp.request_id == "emb-seq"
    assert [o.item_id for o in resp.outputs] == ["b", "a", "c"]
    for i, o in enumerate(resp.outputs):
        assert o.HasField("input_index"), "input_index is present, also for index 0"
        assert o.input_index == i
        assert o.granularity == SEQ
        assert o.WhichOneof("embedding") == "dense"
        assert list(o.dense.shape) == [EMBED_DIM]
        assert len(o.dense.values) == EMBED_DIM
        assert not o.token_ids
        assert norm(o.dense.values) == pytest.approx(1.0, abs=1e-5)  # the fake's default
    assert resp.usage.input_tokens == 5 + 3 + 2
    assert not resp.usage.HasField("cached_input_tokens") or \
        resp.usage.cached_input_tokens <= resp.usage.input_tokens


async def test_embed_explicit_sequence_dense(oe):
    resp = await oe.stub.Embed(embed_req([text("x")], granularity=SEQ, encoding=DENSE))
    (o,) = resp.outputs
    assert o.granularity == SEQ and o.WhichOneof("embedding") == "dense"
    assert list(o.dense.shape) == [EMBED_DIM]


async def test_embed_token_granularity(oe):
    resp = await oe.stub.Embed(embed_req([text("a", "hey"), toks("b", [5, 6])], granularity=TOK))
    for o, ids in zip(resp.outputs, (tokenize("hey"), [5, 6]), strict=True):
        assert o.granularity == TOK
        assert list(o.dense.shape) == [len(ids), EMBED_DIM]
        assert len(o.dense.values) == len(ids) * EMBED_DIM
        assert list(o.token_ids) == ids, "token_ids align with the first tensor dimension"
        for r in range(len(ids)):
            assert norm(o.dense.values[r * EMBED_DIM:(r + 1) * EMBED_DIM]) == pytest.approx(1.0, abs=1e-5)
    assert [o.input_index for o in resp.outputs] == [0, 1]
    assert resp.usage.input_tokens == 5


async def test_embed_normalize_true_and_false(oe):
    on = (await oe.stub.Embed(embed_req([text("a", "hello")], normalize=True))).outputs[0]
    off = (await oe.stub.Embed(embed_req([text("a", "hello")], normalize=False))).outputs[0]
    assert norm(on.dense.values) == pytest.approx(1.0, abs=1e-5)
    assert norm(off.dense.values) > 1.5, "normalize=false returns the raw vector"
    scale = norm(off.dense.values)
    assert [x * scale for x in on.dense.values] == pytest.approx(list(off.dense.values), rel=1e-5)


async def test_embed_dimension_override(oe):
    resp = await oe.stub.Embed(embed_req([text("a"), text("b", "other")], dimensions=4))
    for o in resp.outputs:
        assert list(o.dense.shape) == [4]
        assert len(o.dense.values) == 4
        assert norm(o.dense.values) == pytest.approx(1.0, abs=1e-5)
    native = await oe.stub.Embed(embed_req([text("a")], dimensions=EMBED_DIM))
    assert list(native.outputs[0].dense.shape) == [EMBED_DIM], "the native size itself is allowed"


async def test_embed_sparse_encoding(oe):
    dense = (await oe.stub.Embed(embed_req([text("a", "hi")], encoding=DENSE))).outputs[0].dense
    resp = await oe.stub.Embed(embed_req([text("a", "hi")], encoding=SPARSE))
    (o,) = resp.outputs
    assert o.WhichOneof("embedding") == "sparse"
    sp = o.sparse
    assert list(sp.shape) == [EMBED_DIM]
    idx = list(sp.indices)
    assert idx and len(idx) == len(sp.values)
    assert all(b > a for a, b in pairwise(idx)), "indices strictly increasing"
    assert all(0 <= i < EMBED_DIM for i in idx)
    assert len(idx) < EMBED_DIM, "the fake's 2-token vector has zero components"
    rebuilt = [0.0] * EMBED_DIM
    for i, v in zip(idx, sp.values, strict=True):
        rebuilt[i] = v
    assert rebuilt == pytest.approx(list(dense.values))


async def test_embed_sparse_token_granularity_flattened_indices(oe):
    resp = await oe.stub.Embed(embed_req([text("a", "abc")], encoding=SPARSE, granularity=TOK))
    sp = resp.outputs[0].sparse
    assert list(sp.shape) == [3, EMBED_DIM]
    idx = list(sp.indices)
    assert all(b > a for a, b in pairwise(idx))
    assert idx[-1] < 3 * EMBED_DIM
    assert list(resp.outputs[0].token_ids) == tokenize("abc")


async def test_embed_batch_at_max_batch_size(oe):
    inputs = [text(f"i{k}", "x" * (k + 1)) for k in range(16)]
    resp = await oe.stub.Embed(embed_req(inputs))
    assert [o.item_id for o in resp.outputs] == [f"i{k}" for k in range(16)]
    assert [o.input_index for o in resp.outputs] == list(range(16))


async def test_embed_multimodal_priority_and_metadata_on_wide_model(multi):
    req = embed_req([mm("m", [image()], text="caption"), text("t")],
                    context=ctx("wide", priority=5, metadata={"k": "v"}))
    resp = await multi.stub.Embed(req)
    assert [o.item_id for o in resp.outputs] == ["m", "t"]
    assert all(list(o.dense.shape) == [EMBED_DIM] for o in resp.outputs)


async def test_embed_with_loaded_lora(multi, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    await multi.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
        lora_id=1, lora_name="ad", source_path=str(tmp_path))))
    resp = await multi.stub.Embed(embed_req([text("a")], context=ctx("wide", lora_name="ad")))
    assert len(resp.outputs) == 1
    await multi.stub.UnloadLora(lora_pb2.UnloadLoraRequest(lora_name="ad"))
    await expect_status(multi.stub.Embed(embed_req([text("a")], context=ctx("wide", lora_name="ad"))),
                        NOT_FOUND, "context.lora_name", "ad")


async def test_model_selected_by_alias_and_model_id(oe):
    for name in ("tiny-alias", "fake/tiny-model"):
        resp = await oe.stub.Embed(embed_req([text("a")], context=ctx(name)))
        assert len(resp.outputs) == 1


# =========================================================================== classify success


async def test_classify_probabilities_default(oe):
    resp = await oe.stub.Classify(classify_req([text("a", "good"), toks("b", [9, 1])],
                                               context=ctx(rid="cls-1")))
    assert resp.request_id == "cls-1"
    assert [o.item_id for o in resp.outputs] == ["a", "b"]
    for i, o in enumerate(resp.outputs):
        assert o.HasField("input_index") and o.input_index == i
        assert o.granularity == SEQ
        assert o.semantics == PROBS, "the actual semantics is reported, never UNSPECIFIED"
        assert list(o.scores.shape) == [len(LABELS)]
        assert list(o.labels) == list(LABELS)
        assert len(o.labels) == o.scores.shape[-1]
        assert sum(o.scores.values) == pytest.approx(1.0, abs=1e-5)
        assert all(0.0 <= v <= 1.0 for v in o.scores.values)
    assert resp.usage.input_tokens == 4 + 2


async def test_classify_explicit_probabilities(oe):
    resp = await oe.stub.Classify(classify_req(granularity=SEQ, output_semantics=PROBS))
    assert resp.outputs[0].semantics == PROBS
    assert sum(resp.outputs[0].scores.values) == pytest.approx(1.0, abs=1e-5)


async def test_classify_logits(oe):
    ids = tokenize("good")
    resp = await oe.stub.Classify(classify_req([text("a", "good")], output_semantics=LOGITS))
    (o,) = resp.outputs
    assert o.semantics == LOGITS
    expected = [sum(ids) % 7 * 0.5, len(ids) * 0.1, (ids[0] % 3) * 1.0]
    assert list(o.scores.values) == pytest.approx(expected, abs=1e-6)
    assert sum(o.scores.values) != pytest.approx(1.0)
    assert len(o.labels) == o.scores.shape[-1] == 3


# =========================================================================== score success


async def test_score_model_native_one_group_many_candidates(oe):
    cands = [text("c0", "world"), text("c1", "hello"), toks("c2", [1, 2]), text("c3", "help")]
    resp = await oe.stub.Score(score_req([group("g0", text("q", "hello"), cands)],
                                         context=ctx(rid="score-1")))
    assert resp.request_id == "score-1"
    assert resp.semantics == SIMILARITY
    assert resp.granularity == SEQ
    assert resp.normalization == NORM_NONE
    assert resp.HasField("higher_is_better") and resp.higher_is_better is True
    assert not resp.label_token_ids
    (g,) = resp.groups
    assert g.group_id == "g0" and g.HasField("group_index") and g.group_index == 0
    assert [c.candidate_id for c in g.candidates] == ["c0", "c1", "c2", "c3"], "never sorted"
    for i, c in enumerate(g.candidates):
        assert c.HasField("candidate_index") and c.candidate_index == i
        assert list(c.scores.shape) == [1]
        assert -1.0 - 1e-6 <= c.scores.values[0] <= 1.0 + 1e-6
    values = [c.scores.values[0] for c in g.candidates]
    assert values[1] == pytest.approx(1.0, abs=1e-5), "identical text has cosine 1"
    assert max(values) == values[1]
    assert resp.usage.input_tokens == 5 + 5 + 2 + 4


async def test_score_several_groups_preserve_order(oe):
    groups = [group(f"g{k}", text("q", "query" * (k + 1)),
                    [text("c1", "a"), text("c2", "bb")]) for k in (2, 0, 1)]
    resp = await oe.stub.Score(score_req(groups))
    assert [g.group_id for g in resp.groups] == ["g2", "g0", "g1"]
    for i, g in enumerate(resp.groups):
        assert g.HasField("group_index") and g.group_index == i
        assert [c.candidate_id for c in g.candidates] == ["c1", "c2"], "ids may repeat across groups"
        assert [c.candidate_index for c in g.candidates] == [0, 1]
        assert all(c.HasField("candidate_index") for c in g.candidates)


async def test_score_label_tokens_softmax(oe):
    labels = [7, 3, 5]
    resp = await oe.stub.Score(score_req(
        [group("g", text("q", "Is it?"), [text("yes", "sure"), text("no", "nope")])],
        label_token_ids=labels, normalization=NORM_SOFTMAX))
    assert list(resp.label_token_ids) == labels, "label ids are repeated in request order"
    assert resp.normalization == NORM_SOFTMAX
    assert resp.semantics == PROBS
    for c in resp.groups[0].candidates:
        assert list(c.scores.shape) == [len(labels)], "one score per label"
        assert sum(c.scores.values) == pytest.approx(1.0, abs=1e-5)


async def test_score_label_tokens_none_gives_log_probs(oe):
    labels = [11, 2]
    resp = await oe.stub.Score(score_req(label_token_ids=labels, normalization=NORM_NONE))
    assert list(resp.label_token_ids) == labels
    assert resp.normalization == NORM_NONE
    assert resp.semantics == LOGPROBS
    for c in resp.groups[0].candidates:
        assert list(c.scores.shape) == [2]
        assert all(v <= 0.0 for v in c.scores.values), "log-probabilities are <= 0"
        assert sum(math.exp(v) for v in c.scores.values) <= 1.0 + 1e-6


async def test_score_label_tokens_at_limit_and_explicit_options(oe):
    labels = [1, 2, 3, 4]
    resp = await oe.stub.Score(score_req(label_token_ids=labels, granularity=SEQ,
                                         output_semantics=LOGPROBS))
    assert list(resp.label_token_ids) == labels
    assert resp.semantics == LOGPROBS and resp.granularity == SEQ


async def test_score_instruction_priority_lora_advertised(multi, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    await multi.stub.LoadLora(lora_pb2.LoadLoraRequest(adapter=lora_pb2.LoraAdapter(
        lora_id=3, lora_name="rerank", source_path=str(tmp_path))))
    resp = await multi.stub.Score(score_req(context=ctx("wide", priority=-1, lora_name="rerank"),
                                            instruction="judge relevance"))
    assert [c.candidate_id for c in resp.groups[0].candidates] == ["c0", "c1"]


async def test_rejected_request_does_not_hold_its_id(oe):
    await expect_status(oe.stub.Embed(embed_req([], context=ctx(rid="same"))), INVALID)
    resp = await oe.stub.Embed(embed_req(context=ctx(rid="same")))
    assert resp.request_id == "same"
    resp = await oe.stub.Embed(embed_req(context=ctx(rid="same")))  # finished ids may be reused
    assert len(oe.service.registry) == 0


async def test_duplicate_in_flight_request_id(oe):
    slow = ctx(rid="dup", metadata={"fake.step_delay_ms": "300"})
    first = asyncio.ensure_future(oe.stub.Embed(embed_req(context=slow)))
    await eventually(lambda: oe.service.registry.get("dup") is not None)
    await expect_status(oe.stub.Classify(classify_req(context=ctx(rid="dup"))),
                        grpc.StatusCode.ALREADY_EXISTS, "dup")
    assert (await first).request_id == "dup"


# =========================================================================== rejections

_17 = [text(f"i{k}") for k in range(17)]
_9_CANDS = [text(f"c{k}") for k in range(9)]

# (id, rpc, request, status, message fragments). All run on the `multi` server.
REJECTIONS = [
    # -- context, for each task
    *[(f"{rpc}-missing-context", rpc, req_cls(), INVALID, ["context.request_id"])
      for rpc, req_cls in (("Embed", embedding_pb2.EmbedRequest),
                           ("Classify", classification_pb2.ClassifyRequest),
                           ("Score", scoring_pb2.ScoreRequest))],
    ("embed-missing-context-with-inputs", "Embed", embed_without_context(), INVALID,
     ["context.request_id"]),
    ("embed-empty-request-id", "Embed", embed_req(context=ctx(rid="")), INVALID,
     ["context.request_id"]),
    ("classify-empty-request-id", "Classify", classify_req(context=ctx(rid="")), INVALID,
     ["context.request_id"]),
    ("score-empty-request-id", "Score", score_req(context=ctx(rid="")), INVALID,
     ["context.request_id"]),
    ("embed-empty-model", "Embed", embed_req(context=ctx("")), INVALID, ["context.model"]),
    ("classify-empty-model", "Classify", classify_req(context=ctx("")), INVALID, ["context.model"]),
    ("score-empty-model", "Score", score_req(context=ctx("")), INVALID, ["context.model"]),
    ("embed-unknown-model", "Embed", embed_req(context=ctx("nope")), NOT_FOUND, ["model", "nope"]),
    ("classify-unknown-model", "Classify", classify_req(context=ctx("nope")), NOT_FOUND,
     ["model", "nope"]),
    ("score-unknown-model", "Score", score_req(context=ctx("nope")), NOT_FOUND, ["model", "nope"]),
    # -- task not supported by the model
    ("embed-no-tasks", "Embed", embed_req(context=ctx("no-tasks")), PRECONDITION, ["embed"]),
    ("classify-no-tasks", "Classify", classify_req(context=ctx("no-tasks")), PRECONDITION,
     ["classify"]),
    ("score-no-tasks", "Score", score_req(context=ctx("no-tasks")), PRECONDITION, ["score"]),
    ("embed-supported-false", "Embed", embed_req(context=ctx("disabled")), PRECONDITION, ["embed"]),
    ("classify-supported-false", "Classify", classify_req(context=ctx("disabled")), PRECONDITION,
     ["classify"]),
    ("score-supported-false", "Score", score_req(context=ctx("disabled")), PRECONDITION, ["score"]),
    ("embed-capability-absent", "Embed", embed_req(context=ctx("unreported")), PRECONDITION,
     ["embed"]),
    # -- priority / lora
    ("embed-priority-not-advertised", "Embed", embed_req(context=ctx(priority=1)), INVALID,
     ["context.priority"]),
    ("classify-priority-not-advertised", "Classify", classify_req(context=ctx(priority=0)), INVALID,
     ["context.priority"]),
    ("score-priority-not-advertised", "Score", score_req(context=ctx(priority=2)), INVALID,
     ["context.priority"]),
    ("embed-lora-not-advertised", "Embed", embed_req(context=ctx(lora_name="ad")), INVALID,
     ["context.lora_name"]),
    ("classify-lora-not-advertised", "Classify", classify_req(context=ctx(lora_name="ad")), INVALID,
     ["context.lora_name"]),
    ("score-lora-not-advertised", "Score", score_req(context=ctx(lora_name="ad")), INVALID,
     ["context.lora_name"]),
    ("embed-lora-not-loaded", "Embed", embed_req(context=ctx("wide", lora_name="ghost")), NOT_FOUND,
     ["context.lora_name", "ghost"]),
    ("classify-lora-not-loaded", "Classify", classify_req(context=ctx("wide", lora_name="ghost")),
     NOT_FOUND, ["context.lora_name", "ghost"]),
    ("score-lora-not-loaded", "Score", score_req(context=ctx("wide", lora_name="ghost")), NOT_FOUND,
     ["context.lora_name", "ghost"]),
    # -- inputs (embed and classify share them)
    ("embed-empty-batch", "Embed", embed_req([]), INVALID, ["inputs", "non-empty"]),
    ("classify-empty-batch", "Classify", classify_req([]), INVALID, ["inputs", "non-empty"]),
    ("embed-empty-item-id", "Embed", embed_req([text("a"), text("")]), INVALID,
     ["inputs[1].item_id"]),
    ("classify-empty-item-id", "Classify", classify_req([text("")]), INVALID, ["inputs[0].item_id"]),
    ("embed-duplicate-item-id", "Embed", embed_req([text("a"), text("b"), text("a")]), INVALID,
     ["inputs.item_id", "'a'"]),
    ("classify-duplicate-item-id", "Classify", classify_req([toks("x", [1]), text("x")]), INVALID,
     ["inputs.item_id", "'x'"]),
    ("embed-no-input-variant", "Embed", embed_req([text("a"), tasks_pb2.TaskInput(item_id="b")]),
     INVALID, ["inputs[1]", "exactly one input"]),
    ("classify-no-input-variant", "Classify", classify_req([tasks_pb2.TaskInput(item_id="b")]),
     INVALID, ["inputs[0]", "exactly one input"]),
    ("embed-empty-text", "Embed", embed_req([text("a", "")]), INVALID, ["inputs[0].text"]),
    ("embed-empty-token-ids", "Embed", embed_req([toks("a", [])]), INVALID,
     ["inputs[0].token_ids.ids"]),
    ("embed-multimodal-not-advertised", "Embed", embed_req([mm("a", [image()])]), INVALID,
     ["inputs[0].multimodal", "MULTIMODAL"]),
    ("classify-multimodal-not-advertised", "Classify", classify_req([mm("a", [image()])]), INVALID,
     ["inputs[0].multimodal", "MULTIMODAL"]),
    ("embed-multimodal-without-media", "Embed", embed_req([mm("a", text="only text")],
                                                          context=ctx("wide")),
     INVALID, ["inputs[0].multimodal.media"]),
    ("classify-multimodal-without-media", "Classify", classify_req([mm("a")], context=ctx("wide")),
     INVALID, ["inputs[0].multimodal.media"]),
    ("embed-multimodal-media-without-source", "Embed",
     embed_req([mm("a", [input_pb2.MediaItem(modality=input_pb2.MODALITY_IMAGE)])],
               context=ctx("wide")), INVALID, ["inputs[0].multimodal.media[0]"]),
    ("embed-multimodal-modality-not-advertised", "Embed",
     embed_req([mm("a", [image(modality=input_pb2.MODALITY_AUDIO)])], context=ctx("wide")),
     INVALID, ["inputs[0].multimodal.media[0].modality", "AUDIO"]),
    ("embed-multimodal-empty-prompt-ids", "Embed",
     embed_req([mm("a", [image()], token_ids=input_pb2.TokenIds())], context=ctx("wide")),
     INVALID, ["inputs[0].multimodal.token_ids.ids"]),
    ("embed-over-max-batch", "Embed", embed_req(_17), INVALID, ["inputs", "max_batch_size"]),
    ("classify-over-max-batch", "Classify", classify_req(_17), INVALID, ["inputs", "max_batch_size"]),
    # -- embed options
    ("embed-granularity-not-advertised", "Embed", embed_req(context=ctx("narrow"), granularity=TOK),
     INVALID, ["options.granularity", "TOKEN"]),
    ("embed-granularity-unspecified", "Embed",
     embed_req(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_UNSPECIFIED), INVALID,
     ["options.granularity", "UNSPECIFIED"]),
    ("embed-granularity-unknown-value", "Embed", embed_req(granularity=9), INVALID,
     ["options.granularity"]),
    ("embed-encoding-not-advertised", "Embed", embed_req(context=ctx("narrow"), encoding=SPARSE),
     INVALID, ["options.encoding", "SPARSE"]),
    ("embed-encoding-unspecified", "Embed",
     embed_req(encoding=tasks_pb2.EMBEDDING_ENCODING_UNSPECIFIED), INVALID,
     ["options.encoding", "UNSPECIFIED"]),
    ("embed-dimensions-zero", "Embed", embed_req(dimensions=0), INVALID, ["options.dimensions", "> 0"]),
    ("embed-dimensions-over-native", "Embed", embed_req(dimensions=EMBED_DIM + 1), INVALID,
     ["options.dimensions", "native"]),
    ("embed-dimension-override-not-advertised", "Embed",
     embed_req(context=ctx("narrow"), dimensions=4), INVALID, ["options.dimensions", "not advertised"]),
    ("embed-normalize-not-advertised", "Embed", embed_req(context=ctx("narrow"), normalize=True),
     INVALID, ["options.normalize"]),
    ("embed-normalize-false-not-advertised", "Embed",
     embed_req(context=ctx("narrow"), normalize=False), INVALID, ["options.normalize"]),
    # -- classify options
    ("classify-granularity-not-advertised", "Classify", classify_req(granularity=TOK), INVALID,
     ["options.granularity", "TOKEN"]),
    ("classify-granularity-unspecified", "Classify",
     classify_req(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_UNSPECIFIED), INVALID,
     ["options.granularity"]),
    ("classify-semantics-not-advertised", "Classify", classify_req(output_semantics=LOGPROBS),
     INVALID, ["options.output_semantics", "LOG_PROBABILITIES"]),
    ("classify-semantics-not-advertised-narrow", "Classify",
     classify_req(context=ctx("narrow"), output_semantics=LOGITS), INVALID,
     ["options.output_semantics", "LOGITS"]),
    ("classify-semantics-unspecified", "Classify",
     classify_req(output_semantics=tasks_pb2.TASK_VALUE_SEMANTICS_UNSPECIFIED), INVALID,
     ["options.output_semantics"]),
    # -- score structure
    ("score-no-groups", "Score", score_req([]), INVALID, ["groups", "at least one group"]),
    ("score-empty-group-id", "Score", score_req([group("g0"), group("")]), INVALID,
     ["groups[1].group_id"]),
    ("score-duplicate-group-id", "Score", score_req([group("g"), group("h"), group("g")]), INVALID,
     ["groups.group_id", "'g'"]),
    ("score-missing-query", "Score", score_req([group("g", query=False)]), INVALID,
     ["groups[0].query"]),
    ("score-no-candidates", "Score", score_req([group("g", cands=[])]), INVALID,
     ["groups[0].candidates"]),
    ("score-duplicate-candidate-ids", "Score",
     score_req([group("g", cands=[text("c"), text("d"), text("c")])]), INVALID,
     ["groups[0]", "item_id", "'c'"]),
    ("score-query-id-equals-candidate-id", "Score",
     score_req([group("g", text("same"), [text("same"), text("other")])]), INVALID,
     ["groups[0]", "item_id", "'same'"]),
    ("score-over-max-groups", "Score", score_req([group(f"g{k}") for k in range(9)]), INVALID,
     ["groups", "max_groups"]),
    ("score-over-max-candidates", "Score", score_req([group("g0"), group("g1", cands=_9_CANDS)]),
     INVALID, ["groups[1].candidates", "max_candidates_per_group"]),
    ("score-candidate-without-input", "Score",
     score_req([group("g", cands=[text("c0"), tasks_pb2.TaskInput(item_id="c1")])]), INVALID,
     ["groups[0].candidates[1]", "exactly one input"]),
    ("score-candidate-empty-item-id", "Score", score_req([group("g", cands=[text("")])]), INVALID,
     ["groups[0].candidates[0].item_id"]),
    ("score-query-without-item-id", "Score", score_req([group("g", text(""))]), INVALID,
     ["groups[0].query.item_id"]),
    ("score-query-multimodal-not-advertised", "Score",
     score_req([group("g", mm("q", [image()]))]), INVALID, ["groups[0].query.multimodal"]),
    # -- score options
    ("score-duplicate-label-ids", "Score", score_req(label_token_ids=[5, 6, 5]), INVALID,
     ["options.label_token_ids", "duplicate"]),
    ("score-label-scoring-not-advertised", "Score",
     score_req(context=ctx("narrow"), label_token_ids=[5]), INVALID, ["options.label_token_ids"]),
    ("score-over-max-label-ids", "Score", score_req(label_token_ids=[1, 2, 3, 4, 5]), INVALID,
     ["options.label_token_ids", "max_label_token_ids"]),
    ("score-instruction-not-advertised", "Score", score_req(instruction="rank these"), INVALID,
     ["options.instruction"]),
    ("score-granularity-not-advertised", "Score", score_req(granularity=TOK), INVALID,
     ["options.granularity", "TOKEN"]),
    ("score-semantics-not-advertised", "Score",
     score_req(output_semantics=tasks_pb2.TASK_VALUE_SEMANTICS_REWARD), INVALID,
     ["options.output_semantics", "REWARD"]),
    ("score-semantics-unspecified", "Score",
     score_req(output_semantics=tasks_pb2.TASK_VALUE_SEMANTICS_UNSPECIFIED), INVALID,
     ["options.output_semantics"]),
    ("score-normalization-not-advertised", "Score",
     score_req(context=ctx("narrow"), normalization=NORM_SOFTMAX), INVALID,
     ["options.normalization", "SOFTMAX"]),
    ("score-normalization-unknown-value", "Score", score_req(normalization=7), INVALID,
     ["options.normalization"]),
]


@pytest.mark.parametrize(("rpc", "request_", "status", "fragments"),
                         [pytest.param(*row[1:], id=row[0]) for row in REJECTIONS])
async def test_rejections(multi, rpc, request_, status, fragments):
    exc = await expect_status(getattr(multi.stub, rpc)(request_), status, *fragments)
    err = rejection(exc)
    assert err is not None, "a rejected call carries the EngineError trailer"
    assert err.message == exc.details()
    assert err.code != ErrorCode.UNSPECIFIED
    assert len(multi.service.registry) == 0, "nothing was admitted"
    assert not multi.fake.running


@pytest.mark.parametrize("card", [NO_TASKS, DISABLED], ids=["tasks-none", "supported-false"])
async def test_unsupported_task_on_sole_model(serve, card):
    async with serve(None, cards=[replace(card, supports_lora=False)]) as h:
        name = card.served_model_name
        await expect_status(h.stub.Embed(embed_req(context=ctx(name))), PRECONDITION, "embed")
        await expect_status(h.stub.Classify(classify_req(context=ctx(name))), PRECONDITION, "classify")
        await expect_status(h.stub.Score(score_req(context=ctx(name))), PRECONDITION, "score")


async def test_task_unsupported_by_backend_is_failed_precondition(serve):
    card = _card("gen-only", be.TaskSupport(classify=_BASE.classify, score=_BASE.score))
    async with serve(None, cards=[card], features=frozenset(Feature) - {Feature.EMBED}) as h:
        await expect_status(h.stub.Embed(embed_req(context=ctx("gen-only"))), PRECONDITION)


# =========================================================================== broken engine results


class BrokenBackend(FakeBackend):
    """The fake engine, its task result corrupted in place by ``mutate(result)``."""

    def __init__(self, mutate, **kw) -> None:
        super().__init__(**kw)
        self.mutate = mutate

    async def embed(self, p):
        return self._corrupt(await super().embed(p))

    async def classify(self, p):
        return self._corrupt(await super().classify(p))

    async def score(self, p):
        return self._corrupt(await super().score(p))

    def _corrupt(self, result):
        self.mutate(result)  # in place; the return value is ignored
        return result


def _set(obj, **fields):
    for k, v in fields.items():
        setattr(obj, k, v)


def _first_embedding(r):
    return r.outputs[0].tensor


def _cand(r, g=0, c=0):
    return r.groups[g][c]


def _raise(exc):
    def mutate(_):
        raise exc
    return mutate


BROKEN = [
    # -- embed
    ("embed-nan", "Embed", embed_req(),
     lambda r: _first_embedding(r).values.__setitem__(0, float("nan")), ["finite"]),
    ("embed-inf", "Embed", embed_req(),
     lambda r: _first_embedding(r).values.__setitem__(3, float("-inf")), ["finite"]),
    ("embed-shape-value-count", "Embed", embed_req(),
     lambda r: _set(_first_embedding(r), shape=(EMBED_DIM + 1,)), ["does not match"]),
    ("embed-too-few-values", "Embed", embed_req(),
     lambda r: _first_embedding(r).values.pop(), ["does not match"]),
    ("embed-zero-dimension", "Embed", embed_req(),
     lambda r: _set(_first_embedding(r), shape=(0,), values=[]), ["> 0"]),
    ("embed-wrong-rank", "Embed", embed_req(),
     lambda r: _set(_first_embedding(r), shape=(1, EMBED_DIM)), ["SEQUENCE"]),
    ("embed-empty-shape", "Embed", embed_req(),
     lambda r: _set(_first_embedding(r), shape=()), ["outputs[0]"]),
    ("embed-fewer-outputs", "Embed", embed_req([text("a"), text("b")]),
     lambda r: r.outputs.pop(), ["1 embeddings for 2 inputs"]),
    ("embed-more-outputs", "Embed", embed_req(),
     lambda r: r.outputs.append(r.outputs[0]), ["2 embeddings for 1 inputs"]),
    ("embed-no-outputs", "Embed", embed_req(), lambda r: r.outputs.clear(), ["0 embeddings"]),
    ("embed-unspecified-granularity", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], granularity=Granularity.UNSPECIFIED), ["granularity"]),
    ("embed-granularity-mismatch", "Embed", embed_req(granularity=TOK),
     lambda r: _set(r.outputs[0], granularity=Granularity.SEQUENCE), ["asked for TOKEN"]),
    ("embed-dimensions-mismatch", "Embed", embed_req(dimensions=4),
     lambda r: _set(r.outputs[0], tensor=be.DenseTensor((EMBED_DIM,), [0.1] * EMBED_DIM)),
     ["expected dimension 4"]),
    ("embed-token-ids-misaligned", "Embed", embed_req(granularity=TOK),
     lambda r: _set(r.outputs[0], token_ids=[1]), ["token_ids"]),
    ("embed-token-ids-on-sequence", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], token_ids=[1]), ["token_ids"]),
    ("embed-sparse-unordered", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], tensor=be.SparseTensor((EMBED_DIM,), [3, 1], [0.5, 0.5])),
     ["strictly increasing"]),
    ("embed-sparse-duplicate-index", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], tensor=be.SparseTensor((EMBED_DIM,), [2, 2], [0.5, 0.5])),
     ["strictly increasing"]),
    ("embed-sparse-index-out-of-range", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], tensor=be.SparseTensor((EMBED_DIM,), [1, EMBED_DIM], [0.5, 0.5])),
     ["index"]),
    ("embed-sparse-length-mismatch", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], tensor=be.SparseTensor((EMBED_DIM,), [1, 2], [0.5])),
     ["indices"]),
    ("embed-sparse-nan", "Embed", embed_req(),
     lambda r: _set(r.outputs[0], tensor=be.SparseTensor((EMBED_DIM,), [1], [float("nan")])),
     ["finite"]),
    ("embed-cached-exceeds-input", "Embed", embed_req(),
     lambda r: _set(r.usage, cached_input_tokens=r.usage.input_tokens + 1), ["cached_input_tokens"]),
    ("embed-engine-exception", "Embed", embed_req(), _raise(RuntimeError("boom")), ["boom"]),
    ("embed-engine-failure-internal", "Embed", embed_req(),
     _raise(EngineFailure(ErrorCode.INTERNAL, "kaput")), ["kaput"]),
    # -- classify
    ("classify-unspecified-semantics", "Classify", classify_req(),
     lambda r: _set(r.outputs[0], semantics=ValueSemantics.UNSPECIFIED), ["semantics"]),
    ("classify-semantics-mismatch", "Classify", classify_req(output_semantics=LOGITS),
     lambda r: _set(r.outputs[0], semantics=ValueSemantics.PROBABILITIES), ["asked for LOGITS"]),
    ("classify-nan", "Classify", classify_req(),
     lambda r: r.outputs[0].scores.values.__setitem__(1, float("nan")), ["finite"]),
    ("classify-label-count", "Classify", classify_req(),
     lambda r: _set(r.outputs[0], labels=LABELS[:2]), ["labels"]),
    ("classify-shape-value-count", "Classify", classify_req(),
     lambda r: (_set(r.outputs[0].scores, shape=(4,)), _set(r.outputs[0], labels=())),
     ["does not match"]),
    ("classify-fewer-outputs", "Classify", classify_req([text("a"), text("b")]),
     lambda r: r.outputs.pop(0), ["1 classifications for 2 inputs"]),
    ("classify-granularity-mismatch", "Classify", classify_req(granularity=SEQ),
     lambda r: _set(r.outputs[0], granularity=Granularity.TOKEN), ["asked for SEQUENCE"]),
    # -- score
    ("score-unspecified-semantics", "Score", score_req(),
     lambda r: _set(r, semantics=ValueSemantics.UNSPECIFIED), ["semantics"]),
    ("score-semantics-mismatch", "Score", score_req(output_semantics=SIMILARITY),
     lambda r: _set(r, semantics=ValueSemantics.RELEVANCE), ["asked for SIMILARITY"]),
    ("score-unspecified-granularity", "Score", score_req(),
     lambda r: _set(r, granularity=Granularity.UNSPECIFIED), ["granularity"]),
    ("score-normalization-mismatch", "Score", score_req(label_token_ids=[1, 2],
                                                        normalization=NORM_SOFTMAX),
     lambda r: _set(r, normalization=ScoreNormalization.NONE), ["normalization"]),
    ("score-fewer-groups", "Score", score_req([group("g0"), group("g1")]),
     lambda r: r.groups.pop(), ["1 score groups for 2"]),
    ("score-fewer-candidates", "Score", score_req(),
     lambda r: r.groups[0].pop(), ["groups[0]", "1 scores for 2 candidates"]),
    ("score-nan", "Score", score_req(),
     lambda r: _cand(r, 0, 1).scores.values.__setitem__(0, float("nan")), ["finite"]),
    ("score-shape-value-count", "Score", score_req(),
     lambda r: _set(_cand(r).scores, shape=(2,)), ["does not match"]),
    ("score-labels-not-echoed", "Score", score_req(label_token_ids=[1, 2]),
     lambda r: _set(r, label_token_ids=(2, 1)), ["label_token_ids"]),
    ("score-one-score-per-label", "Score", score_req(label_token_ids=[1, 2]),
     lambda r: _set(_cand(r), scores=be.DenseTensor((1,), [-0.5])), ["one score per label"]),
    ("score-cached-exceeds-input", "Score", score_req(),
     lambda r: _set(r.usage, cached_input_tokens=10 ** 6), ["cached_input_tokens"]),
]


@pytest.mark.parametrize(("rpc", "request_", "mutate", "fragments"),
                         [pytest.param(*row[1:], id=row[0]) for row in BROKEN])
async def test_contract_breaking_engine_result_is_internal(rpc, request_, mutate, fragments):
    async with serve_backend(BrokenBackend(mutate)) as h:
        exc = await expect_status(getattr(h.stub, rpc)(request_), INTERNAL, *fragments)
        err = rejection(exc)
        assert err is not None and err.code == ErrorCode.INTERNAL
        assert len(h.service.registry) == 0, "the request id is released"
        h.fake.mutate = lambda r: None
        assert await getattr(h.stub, rpc)(request_), "the server keeps serving afterwards"


@pytest.mark.parametrize(("code", "status"), [
    (ErrorCode.OVERLOADED, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ErrorCode.INVALID_ARGUMENT, INVALID),
])
async def test_engine_failure_maps_to_status(code, status):
    async with serve_backend(BrokenBackend(_raise(EngineFailure(code, "engine says no")))) as h:
        exc = await expect_status(h.stub.Classify(classify_req()), status, "engine says no")
        assert rejection(exc).code == code


async def test_fp32_overflow_is_not_a_finite_success():
    def mutate(r):
        _first_embedding(r).values[0] = 1e39
    async with serve_backend(BrokenBackend(mutate)) as h:
        await expect_status(h.stub.Embed(embed_req()), INTERNAL)


async def test_explicit_encoding_must_be_honoured():
    def mutate(r):
        t = _first_embedding(r)
        r.outputs[0].tensor = be.DenseTensor(t.shape, [0.0] * EMBED_DIM)
    async with serve_backend(BrokenBackend(mutate)) as h:
        await expect_status(h.stub.Embed(embed_req(encoding=SPARSE)), INTERNAL, "encoding")


async def test_native_dimension_is_honoured_without_override():
    def mutate(r):
        r.outputs[0].tensor = be.DenseTensor((5,), [0.2] * 5)
    async with serve_backend(BrokenBackend(mutate)) as h:
        await expect_status(h.stub.Embed(embed_req()), INTERNAL, "dimension")
