"""Embed, Classify and Score: one unary call each, validated, admitted and abortable like Generate."""

from __future__ import annotations

import asyncio
import logging

from openengine_adapters.core.state import CoreState
from openengine_adapters.errors import EngineFailure, RequestRejected, refusal, rejected
from openengine_adapters.messages.tasks import classify_response, embed_response, score_response
from openengine_adapters.types import ErrorCode, Feature
from openengine_adapters.validation.tasks import parse_classify, parse_embed, parse_score

log = logging.getLogger(__name__)


class TaskRpcs(CoreState):
    async def _task(self, request, context, parse, call, build, task: str):
        # no _require here: without the feature no card advertises the task, and the spec
        # answers an unsupported task with FAILED_PRECONDITION (from parse)
        self._check_accepting()
        card, params = parse(request, self.catalog, self._loras)
        entry = self._admit(params.context.request_id)
        work = asyncio.ensure_future(call(params))
        entry.on_abort = work.cancel
        try:
            result = await work
            self.watchdog.progress += 1
            return build(params, result, getattr(card.tasks, task))
        except asyncio.CancelledError:
            if work.cancelled() and entry.aborted and asyncio.current_task().cancelling() == 0:
                failure = rejected(entry.abort_code, entry.abort_message,
                                   retry_after_ms=None if entry.abort_code == ErrorCode.CANCELLED else 0)
            else:  # the client went away: stop the engine work
                work.cancel()
                raise
        except Exception as exc:
            if not isinstance(exc, RequestRejected | EngineFailure):
                log.exception("%s %s failed in the engine", task, params.context.request_id)
            failure = refusal(exc)
        finally:
            if not work.done():
                work.cancel()
            if work.cancelled() and Feature.ABORT in self.backend.features:
                self._background(self.backend.abort([entry.request_id]))
            self.registry.complete(entry)
            self.admission.release()
        raise failure

    async def Embed(self, request, context):
        return await self._task(request, context, parse_embed, self.backend.embed,
                                embed_response, "embed")

    async def Classify(self, request, context):
        return await self._task(request, context, parse_classify,
                                self.backend.classify, classify_response, "classify")

    async def Score(self, request, context):
        return await self._task(request, context, parse_score, self.backend.score,
                                score_response, "score")
