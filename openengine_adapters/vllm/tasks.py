"""Embed, classify and score on vLLM: pooling requests (``AsyncLLM.encode``), cross-encoder and
cosine scores, and label-token scoring on a causal LM (one 1-token generate per pair).

A mixin of ``VllmBackend``: it reads the backend's engine, model config and LoRA registry.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.scores import label_score_result, relevance_score_result
from openengine_adapters.types import (
    Granularity,
    ScoreNormalization,
    ValueSemantics,
)
from openengine_adapters.vllm import request_mapping
from openengine_adapters.vllm.errors import client_error, engine_failure


class VllmTasks:
    """The task RPCs of ``VllmBackend``."""

    def _task_prompt(self, item: be.TaskItem) -> dict:
        if item.token_ids is not None:
            return {"prompt_token_ids": list(item.token_ids)}
        return {"prompt": item.text}

    async def _pool(self, items: Sequence[be.TaskItem | dict], task: str, request_id: str, ctx=None,
                    **pooling):
        """Run one pooling request per item concurrently; outputs in item order."""
        from vllm.pooling_params import PoolingParams

        lora = self._lora(ctx.lora_name) if ctx is not None else None
        priority = request_mapping.engine_priority(ctx.priority if ctx is not None else None)
        jobs = []
        for engine_id, item in zip(self._sub_ids(request_id, len(items)), items, strict=True):
            prompt = dict(item) if isinstance(item, dict) else self._task_prompt(item)
            params = PoolingParams(task=task, **pooling)
            if "token_type_ids" in prompt:  # cross-encoder pairs, passed as vLLM's scorer does
                from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids

                params.extra_kwargs = {"compressed_token_type_ids":
                                       compress_token_type_ids(prompt.pop("token_type_ids"))}
            jobs.append(_final(self.engine.encode(prompt, params, engine_id, lora_request=lora,
                                                  priority=priority)))
        try:
            return await asyncio.gather(*jobs)
        finally:
            self._subrequests.pop(request_id, None)

    def _sub_ids(self, request_id: str, count: int) -> list[str]:
        """Engine ids for the items of one task request. vLLM aborts every request sharing an
        external id, so they carry a random part no client id can collide with."""
        salt = uuid.uuid4().hex[:12]
        ids = [f"{request_id}/oe-{salt}-{i}" for i in range(count)]
        self._subrequests[request_id] = ids
        return ids

    async def embed(self, p: be.EmbedParams) -> be.EmbedResult:
        token = p.granularity == Granularity.TOKEN
        kw = {}
        if p.normalize is not None:
            kw["use_activation"] = p.normalize
        if p.dimensions is not None:
            kw["dimensions"] = p.dimensions
        outs = await self._pool(p.inputs, "token_embed" if token else "embed", p.context.request_id,
                                p.context, **kw)
        results, total = [], 0
        for out in outs:
            data = out.outputs.data
            ids = list(out.prompt_token_ids)
            total += len(ids)
            if token:
                rows = data.tolist()
                results.append(be.Embedding(Granularity.TOKEN, be.DenseTensor((len(rows), len(rows[0])),
                                                                                [x for r in rows for x in r]), ids))
            else:
                values = data.tolist()
                results.append(be.Embedding(Granularity.SEQUENCE, be.DenseTensor((len(values),), values)))
        return be.EmbedResult(results, be.TaskUsageData(total, sum(o.num_cached_tokens or 0 for o in outs)))

    def _labels(self) -> list[str]:
        id2label = getattr(self.model_config.hf_config, "id2label", None) or {}
        return [str(id2label[i]) for i in sorted(id2label)] if id2label else []

    async def classify(self, p: be.ClassifyParams) -> be.ClassifyResult:
        logits = p.semantics == ValueSemantics.LOGITS
        outs = await self._pool(p.inputs, "classify", p.context.request_id, p.context,
                                use_activation=not logits)
        labels = self._labels()
        results, total = [], 0
        for out in outs:
            values = out.outputs.data.tolist()
            total += len(out.prompt_token_ids)
            sem = ValueSemantics.LOGITS if logits else ValueSemantics.PROBABILITIES
            results.append(be.Classification(Granularity.SEQUENCE, sem, be.DenseTensor((len(values),), values),
                                             labels if len(labels) == len(values) else ()))
        return be.ClassifyResult(results, be.TaskUsageData(total))

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        if p.label_token_ids:
            return await self._label_token_score(p)
        if self._num_labels() == 1 and "classify" in self.supported_tasks:
            return await self._cross_encoder_score(p)
        return await self._cosine_score(p)

    async def _cross_encoder_score(self, p: be.ScoreParams) -> be.ScoreResult:
        tokenizer = self.engine.tokenizer
        prompts = []
        for g in p.groups:
            for c in g.candidates:
                enc = tokenizer(text=g.query.text, text_pair=c.text)
                prompt = {"prompt_token_ids": enc["input_ids"]}
                if "token_type_ids" in enc:
                    prompt["token_type_ids"] = enc["token_type_ids"]
                prompts.append(prompt)
        outs = await self._pool(prompts, "classify", p.context.request_id, p.context, use_activation=False)
        values = [float(out.outputs.data.reshape(-1)[0]) for out in outs]
        return relevance_score_result(p, values, sum(len(out.prompt_token_ids) for out in outs))

    async def _cosine_score(self, p: be.ScoreParams) -> be.ScoreResult:
        items = [it for g in p.groups for it in (g.query, *g.candidates)]
        outs = await self._pool(items, "embed", p.context.request_id, p.context)
        vectors = [o.outputs.data.tolist() for o in outs]
        groups, k = [], 0
        for g in p.groups:
            q = vectors[k]
            k += 1
            row = []
            for _ in g.candidates:
                row.append(be.CandidateScore(be.DenseTensor((1,), [_cosine(q, vectors[k])])))
                k += 1
            groups.append(row)
        total = sum(len(o.prompt_token_ids) for o in outs)
        return be.ScoreResult(groups, Granularity.SEQUENCE, ValueSemantics.SIMILARITY, ScoreNormalization.NONE,
                              higher_is_better=True, usage=be.TaskUsageData(total))

    async def _label_token_score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Causal-LM label-token scoring: the next-token log-probabilities of the label tokens
        after query + candidate, from one 1-token generation per pair."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        labels = list(p.label_token_ids)
        tokenizer = self.engine.tokenizer

        def ids(item: be.TaskItem) -> list[int]:
            if item.token_ids is not None:
                return list(item.token_ids)
            return tokenizer.encode(item.text, add_special_tokens=False)

        lora = self._lora(p.context.lora_name)
        priority = request_mapping.engine_priority(p.context.priority)

        async def one(rid: str, prompt_ids: list[int]) -> tuple[list[float], int]:
            sp = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=labels,
                                output_kind=RequestOutputKind.FINAL_ONLY)
            final = await _final(self.engine.generate({"prompt_token_ids": prompt_ids}, sp, rid,
                                                      lora_request=lora, priority=priority))
            position = final.outputs[0].logprobs[0]
            return [position[t].logprob for t in labels], len(prompt_ids)

        prompts, shape = [], []
        for g in p.groups:
            head = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None and g.query.text is not None
                    else []) + ids(g.query)
            shape.append(len(g.candidates))
            prompts.extend(head + ids(c) for c in g.candidates)
        engine_ids = self._sub_ids(p.context.request_id, len(prompts))
        try:
            results = await asyncio.gather(*(one(rid, prompt) for rid, prompt in zip(engine_ids, prompts,
                                                                                      strict=True)))
        finally:
            self._subrequests.pop(p.context.request_id, None)
        return label_score_result(p, [values for values, _ in results], sum(used for _, used in results))


async def _final(outputs):
    """The last output of a one-shot vLLM stream (encode, or a FINAL_ONLY generate), with vLLM's
    request errors as INVALID_ARGUMENT and anything else as an engine failure."""
    from vllm.exceptions import VLLMClientError

    last = None
    try:
        async for out in outputs:
            last = out
    except asyncio.CancelledError:
        raise
    except (VLLMClientError, ValueError) as exc:
        raise client_error(exc) from None
    except Exception as exc:
        raise engine_failure(exc) from None
    return last


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
