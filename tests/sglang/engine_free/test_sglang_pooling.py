"""The SGLang adapter's pooling-model description and load-snapshot events (no SGLang needed)."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from openengine_adapters.sglang import pooling
from openengine_adapters.sglang.stats import LoadPoller
from openengine_adapters.types import RuntimeEventType, ValueSemantics


def config(arch, **hf):
    return SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch], **hf), hidden_size=hf.get("hidden_size"),
                           is_matryoshka=hf.pop("matryoshka", False))


def test_describe_kinds():
    assert pooling.describe(config("LlamaForCausalLM"), is_generation=True).kind is None
    emb = pooling.describe(config("BertModel", hidden_size=384), is_generation=False)
    assert (emb.kind, emb.hidden_size, emb.matryoshka) == ("embed", 384, False)
    cls = pooling.describe(config("LlamaForSequenceClassification", num_labels=3,
                                  id2label={0: "neg", 1: "neu", 2: "pos"}), is_generation=False)
    assert (cls.kind, cls.labels, cls.cross_encoder) == ("classify", ("neg", "neu", "pos"), False)
    assert cls.classify_semantics() == (ValueSemantics.PROBABILITIES, ValueSemantics.LOGITS)
    ce = pooling.describe(config("BertForSequenceClassification", num_labels=1, id2label={0: "score"}), False)
    assert ce.cross_encoder
    act = pooling.describe(config("BertForSequenceClassification", num_labels=1, id2label={0: "s"},
                                  sbert_ce_default_activation_function="torch.nn.modules.activation.Sigmoid"), False)
    assert act.classify_semantics() == (ValueSemantics.MODEL_DEFINED,)
    assert pooling.describe(config("Qwen2ForRewardModel"), False).kind is None


def test_values_and_activations():
    assert pooling.values({"embedding": 0.5}) == [0.5]
    assert pooling.values({"embedding": [1, 2]}) == [1.0, 2.0]
    assert sum(pooling.probabilities([1.0, 2.0, 3.0], sigmoid=False)) == pytest.approx(1.0)
    assert pooling.probabilities([0.0, -800.0], sigmoid=True) == pytest.approx([0.5, 0.0])
    v = pooling.l2_normalize([3.0, 4.0])
    assert v == [0.6, 0.8] and math.isclose(math.hypot(*v), 1.0)


def snap(ts, running, waiting, used=8):
    return SimpleNamespace(dp_rank=0, timestamp=ts, num_running_reqs=running, num_waiting_reqs=waiting,
                           num_used_tokens=used, max_total_num_tokens=8192, token_usage=used / 8192,
                           num_waiting_uncached_tokens=0, gen_throughput=1.5, cache_hit_rate=0.0,
                           total_prefill_uncached_tokens=10)


async def test_poller_publishes_batch_per_snapshot_and_queue_on_change():
    poller = LoadPoller(reads=None, interval=1.0, page_size=4)
    sub = poller.events.subscribe()
    poller.observe([snap(1.0, 1, 0)])
    poller.observe([snap(1.0, 1, 0)])      # the same snapshot again: nothing new
    poller.observe([snap(2.0, 1, 2, 9)])   # waiting changed: BATCH and QUEUE
    got = []
    it = sub.__aiter__()
    for _ in range(4):
        got.append(await asyncio.wait_for(it.__anext__(), 1))
    assert [e.type for e in got] == [RuntimeEventType.BATCH, RuntimeEventType.QUEUE, RuntimeEventType.BATCH,
                                     RuntimeEventType.QUEUE]
    assert got[2].attributes["used_kv_blocks"] == "3" and got[2].timestamp_unix_nanos == 2_000_000_000
    assert got[3].attributes["waiting_requests"] == "2"
    assert len(sub) == 0
