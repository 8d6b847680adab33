"""Embed, classify and score on SGLang: the pooling models' requests (one ``EmbeddingReqInput``
per item) and label-token scoring on a causal LM (``TokenizerManager.score_request``).

A mixin of ``SglangBackend``: it reads the backend's tokenizer manager, tokenizer and pooling model.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.scores import label_score_result, relevance_score_result
from openengine_adapters.errors import EngineFailure, RequestRejected, invalid
from openengine_adapters.sglang import output_mapping, pooling, request_mapping
from openengine_adapters.types import (
    ErrorCode,
    Granularity,
    ValueSemantics,
)


class SglangTasks:
    """The task RPCs of ``SglangBackend``."""

    # ------------------------------------------------------------------ embed / classify / rerank

    async def _encode(self, items: list[dict[str, Any]], request_id: str,
                      dimensions: int | None = None) -> list[dict]:
        """One SGLang ``EmbeddingReqInput`` per item (``text``, ``input_ids`` or a cross-encoder
        ``pair`` [query, document]), run concurrently (SGLang batches them), with rids that cannot
        prefix one another; Abort(request_id) reaches them and a cancelled call aborts them."""
        from sglang.srt.managers.io_struct import EmbeddingReqInput

        rids = request_mapping.engine_rids(request_id, len(items))
        done: set[str] = set()

        async def one(rid: str, item: dict[str, Any]) -> dict:
            pair = "pair" in item  # SGLang takes a [query, document] pair only as a batch of pairs
            kw = {"text": [item["pair"]], "rid": [rid], "is_cross_encoder_request": True} if pair else \
                {**item, "rid": rid}
            out = await self.tm.generate_request(EmbeddingReqInput(dimensions=dimensions, **kw), None).__anext__()
            if pair:
                (out,) = out
            done.add(rid)
            reason = (out.get("meta_info") or {}).get("finish_reason") or {}
            if reason.get("type") == "abort":
                raise output_mapping.abort_failure(reason) or EngineFailure(ErrorCode.CANCELLED, "aborted")
            return out

        self._live[request_id] = rids
        try:
            return list(await asyncio.gather(*(one(r, it) for r, it in zip(rids, items, strict=True))))
        except (RequestRejected, EngineFailure):
            raise
        except ValueError as exc:
            where = "options.dimensions" if dimensions is not None and "dimension" in str(exc).lower() else "inputs"
            raise invalid(f"{where}: rejected by SGLang: {exc}") from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EngineFailure(ErrorCode.INTERNAL, f"SGLang encode failed: {type(exc).__name__}: {exc}") from None
        finally:
            for rid in rids:
                if rid not in done:
                    self._abort_rid(rid)
            if self._live.get(request_id) is rids:
                del self._live[request_id]

    @staticmethod
    def _item(it: be.TaskItem) -> dict[str, Any]:
        return {"input_ids": list(it.token_ids)} if it.token_ids is not None else {"text": it.text}

    async def embed(self, p: be.EmbedParams) -> be.EmbedResult:
        """SGLang's pooler truncates to ``dimensions`` then L2-normalizes: ``normalize=True`` is
        re-applied here (exact unit norm), ``normalize=False`` cannot be honoured."""
        if p.normalize is False:
            raise invalid(f"options.normalize: false cannot be honoured: SGLang's {self.pooling.architecture} "
                          "pooler returns L2-normalized embeddings and the raw vector is not recoverable")
        outs = await self._encode([self._item(it) for it in p.inputs], p.context.request_id, p.dimensions)
        results, total = [], 0
        for out in outs:
            vec = pooling.values(out)
            if p.normalize:
                vec = pooling.l2_normalize(vec)
            total += int(out["meta_info"].get("prompt_tokens") or 0)
            results.append(be.Embedding(Granularity.SEQUENCE, be.DenseTensor((len(vec),), vec)))
        return be.EmbedResult(results, be.TaskUsageData(total))

    async def classify(self, p: be.ClassifyParams) -> be.ClassifyResult:
        """SGLang returns the head's raw logits; PROBABILITIES (the default) is softmax across the
        labels, or a sigmoid per label for one label / multi-label models."""
        m = self.pooling
        semantics = p.semantics or m.classify_semantics()[0]
        outs = await self._encode([self._item(it) for it in p.inputs], p.context.request_id)
        results, total = [], 0
        for out in outs:
            vals = pooling.values(out)
            if semantics == ValueSemantics.PROBABILITIES:
                vals = pooling.probabilities(vals, sigmoid=m.num_labels == 1 or m.multi_label)
            total += int(out["meta_info"].get("prompt_tokens") or 0)
            labels = m.labels if len(m.labels) == len(vals) else ()
            results.append(be.Classification(Granularity.SEQUENCE, semantics, be.DenseTensor((len(vals),), vals),
                                             labels))
        return be.ClassifyResult(results, be.TaskUsageData(total))

    async def _rerank(self, p: be.ScoreParams) -> be.ScoreResult:
        """Cross-encoder relevance: SGLang's rerank path (``is_cross_encoder_request``: query and
        document tokenized as one pair with token type ids), the head's logit per pair."""
        pairs = [{"pair": [g.query.text, c.text]} for g in p.groups for c in g.candidates]
        outs = await self._encode(pairs, p.context.request_id)
        values = []
        for out in outs:
            (value,) = pooling.values(out)  # one relevance logit per pair
            values.append(value)
        total = sum(int(out["meta_info"].get("prompt_tokens") or 0) for out in outs)
        return relevance_score_result(p, values, total)

    # ------------------------------------------------------------------ score

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        if not self.is_generation:
            return await self._rerank(p)  # the card offers only native scoring then
        return await self._label_score(p)

    async def _label_score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Label-token scoring with SGLang's ``async_score``: the next-token log-probabilities of
        the label tokens after query + candidate (SGLang's ``token_logprobs``), softmaxed across
        the labels on request by the shared ``label_score_result``."""
        labels = list(p.label_token_ids)  # non-empty: the card declares native_scoring=False
        per_pair: list[list[float]] = []
        total = 0
        for g in p.groups:
            if g.query.token_ids is not None:
                query: Any = list(g.query.token_ids)
                items: Any = [list(c.token_ids) if c.token_ids is not None else self._ids(c.text) for c in g.candidates]
            else:
                query = g.query.text
                items = [c.text if c.text is not None else self.tokenizer.decode(list(c.token_ids))
                         for c in g.candidates]
            try:
                result = await self.tm.score_request(query=query, items=items, label_token_ids=labels,
                                                     apply_softmax=False, return_token_logprobs=True, request=None)
            except ValueError as exc:
                raise invalid(f"groups: rejected by SGLang: {exc}") from None
            except Exception as exc:
                raise EngineFailure(ErrorCode.INTERNAL, f"SGLang score failed: {exc}") from None
            if result.token_logprobs is None or len(result.token_logprobs) != len(g.candidates):
                raise EngineFailure(ErrorCode.INTERNAL, f"SGLang returned no label logprobs for group {g.group_id!r}")
            per_pair.extend([float(x) for x in row] for row in result.token_logprobs)
            total += int(result.prompt_tokens or 0)
        return label_score_result(p, per_pair, total)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
