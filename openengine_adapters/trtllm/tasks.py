"""Score on TensorRT-LLM: label-token scoring from the raw logits of one 1-token generation per
(query, candidate) pair.

A mixin of ``TrtllmBackend``.
"""

from __future__ import annotations

import asyncio

from openengine_adapters import backend as be
from openengine_adapters.engine_kit.scores import label_logprobs, label_score_result
from openengine_adapters.errors import EngineFailure
from openengine_adapters.trtllm.handles import abort_handle, iterate
from openengine_adapters.types import ErrorCode


class TrtllmTasks:
    """The task RPCs of ``TrtllmBackend``."""

    def _ids(self, item: be.TaskItem) -> list[int]:
        if item.token_ids is not None:
            return list(item.token_ids)
        return list(self.tokenizer.encode(item.text, add_special_tokens=False))

    async def score(self, p: be.ScoreParams) -> be.ScoreResult:
        """Label-token scoring: the log-probabilities of the label tokens as the next token after
        query + candidate, exact for every label. One 1-token greedy generation per pair returns
        the raw logits of that position (``return_generation_logits``), log-softmaxed here.

        Not logprobs: in TensorRT-LLM 1.2.x both kinds are top-k only. Prompt logprobs come from
        ``tensorrt_llm/executor/base_worker.py`` ``_compute_pytorch_prompt_logprobs``, which calls
        ``compute_logprobs(k, None, context_logits, None, None)`` without the prompt tokens, so
        ``executor/result.py`` ``_topk_logprobs`` adds no prompt token outside the top k (that
        came with PR #11235, the 1.3 line); output logprobs add at most the sampled token.
        """
        from tensorrt_llm import SamplingParams

        labels = list(p.label_token_ids)  # non-empty: the card declares native_scoring=False
        lora = self._loras.get(p.context.lora_name) if p.context.lora_name else None
        handles: list = []

        async def one(where: str, prompt_ids: list[int]) -> list[float]:
            sp = SamplingParams(max_tokens=1, temperature=0.0, return_generation_logits=True)
            kw = {"lora_request": lora} if lora is not None else {}
            self._submitted = True
            handle = self.llm.generate_async({"prompt_token_ids": prompt_ids}, sp, streaming=False, **kw)
            handles.append(handle)
            last = None
            async for out in iterate(handle):
                last = out
            comp = last.outputs[0] if last is not None and last.outputs else None
            logits = comp.generation_logits if comp is not None and comp.finish_reason != "cancelled" else None
            if logits is None or len(logits) == 0:
                raise EngineFailure(ErrorCode.INTERNAL, f"TensorRT-LLM returned no generation logits for {where} "
                                    "(it skips them with speculative decoding)")
            # a vocabulary-wide row: off the event loop, which streams other requests meanwhile
            return await asyncio.to_thread(lambda: label_logprobs(logits[0].tolist(), labels))

        jobs, shape, total = [], [], 0
        for g in p.groups:
            # a text query starts as the model's tokenizer starts a prompt (BOS where it adds one):
            # TensorRT-LLM's tokenizer wrapper has no bos_token_id to read
            head = (list(self.tokenizer.encode(g.query.text)) if g.query.text is not None
                    else list(g.query.token_ids))
            shape.append(len(g.candidates))
            for c in g.candidates:
                ids = head + self._ids(c)
                total += len(ids)
                jobs.append(one(f"group {g.group_id!r} candidate {c.item_id!r}", ids))
        try:
            results = await asyncio.gather(*jobs)
        finally:
            for h in handles:
                if not getattr(h, "finished", True):
                    abort_handle(h)
        return label_score_result(p, results, total)
