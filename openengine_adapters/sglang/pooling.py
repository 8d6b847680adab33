"""SGLang pooling models (``--is-embedding``): what a model is for, and its values (no SGLang import).

Facts from SGLang 0.5.23's source (``srt/models``, ``srt/layers/pooler.py``):

- An embedding model's ``Pooler`` truncates to ``dimensions`` (Matryoshka) and THEN L2-normalizes
  (``normalize=True`` in BertModel, LlamaEmbeddingModel, Qwen3, Gemma, CLIP, ...): what
  ``async_encode`` returns is already unit-norm, so the raw vector cannot be recovered.
  BertModel pools the CLS token (``PoolingType.CLS`` when serving embeddings); it does not read a
  sentence-transformers ``1_Pooling`` config, so a mean-pooling model such as all-MiniLM-L6-v2 gets
  its CLS vector, not its sentence-transformers embedding.
- A ``*ForSequenceClassification`` model returns its head's raw logits (Llama/Qwen: last token;
  Bert/XLM-R: ``CrossEncodingPooler`` on the CLS pooler). The cross-encoding pooler applies
  ``sbert_ce_default_activation_function`` when the config names one (else identity).
- ``*Reward*`` models return a reward; they are not offered as a task here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openengine_adapters.types import ValueSemantics

# Architectures whose classification head goes through SGLang's CrossEncodingPooler (which applies
# sbert_ce_default_activation_function); other classifiers return the plain head output.
CROSS_ENCODING_POOLER = frozenset({"BertForSequenceClassification", "XLMRobertaForSequenceClassification"})
# Bidirectional (encoder-only) architectures: SGLang's radix cache must be off for them (it would
# reuse a shared prefix's KV, and its token-type-id batching assumes no cached prefix).
ENCODER_ONLY = frozenset({"BertModel", "Contriever", "BertForSequenceClassification", "XLMRobertaModel",
                          "XLMRobertaForSequenceClassification"})


@dataclass(frozen=True)
class PoolingModel:
    kind: str | None              # "embed", "classify" or None (generative, reward: no pooling task here)
    architecture: str = ""
    hidden_size: int | None = None
    num_labels: int = 0
    labels: tuple[str, ...] = ()
    matryoshka: bool = False
    # classify: how SGLang's values are to be read
    sglang_activation: str = ""   # the activation SGLang applies itself ("" = raw logits)
    multi_label: bool = False
    regression: bool = False

    @property
    def cross_encoder(self) -> bool:
        """One relevance logit per (query, document) pair: SGLang's rerank path."""
        return self.kind == "classify" and self.num_labels == 1 and not self.regression

    def classify_semantics(self) -> tuple[ValueSemantics, ...]:
        if self.sglang_activation or self.regression:
            return (ValueSemantics.MODEL_DEFINED,)
        return (ValueSemantics.PROBABILITIES, ValueSemantics.LOGITS)


def describe(model_config: Any, is_generation: bool) -> PoolingModel:
    """The pooling task of the model SGLang serves (``tokenizer_manager.model_config``)."""
    hf = getattr(model_config, "hf_config", None)
    archs = list(getattr(hf, "architectures", None) or [])
    arch = archs[0] if archs else ""
    hidden = getattr(model_config, "hidden_size", None) or getattr(hf, "hidden_size", None)
    if is_generation or hf is None:
        return PoolingModel(None, arch)
    if "Reward" in arch:
        return PoolingModel(None, arch)
    if arch.endswith("ForSequenceClassification"):
        num = int(getattr(hf, "num_labels", 0) or 0)
        id2label = getattr(hf, "id2label", None) or {}
        labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int)) if len(id2label) == num else ()
        act = getattr(hf, "sbert_ce_default_activation_function", None) if arch in CROSS_ENCODING_POOLER else None
        problem = getattr(hf, "problem_type", None)
        return PoolingModel("classify", arch, hidden, num, labels, sglang_activation=str(act or ""),
                            multi_label=problem == "multi_label_classification", regression=problem == "regression")
    return PoolingModel("embed", arch, int(hidden) if hidden else None,
                        matryoshka=bool(getattr(model_config, "is_matryoshka", False)))


def values(out: Any) -> list[float]:
    """One SGLang encode output's ``embedding`` as a flat list (a 1-label head gives a scalar)."""
    value = out["embedding"]
    if isinstance(value, int | float):
        return [float(value)]
    if hasattr(value, "tolist"):
        value = value.tolist()
        if isinstance(value, int | float):
            return [float(value)]
    return [float(x) for x in value]


def l2_normalize(vec: Sequence[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vec))
    return [x / norm for x in vec] if norm else list(vec)


def probabilities(logits: Sequence[float], sigmoid: bool) -> list[float]:
    """Softmax across the labels, or an independent sigmoid per label (one label / multi-label)."""
    if sigmoid:
        return [_sigmoid(x) for x in logits]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
