"""Embed/Classify/Score requests the checks share (tasks, and lifecycle's drain): the advertised task
capability, typed inputs the model takes, and one small valid batch call per task."""

from __future__ import annotations

from conformance.registry import Skip
from openengine_adapters.v1 import classification_pb2, embedding_pb2, input_pb2, scoring_pb2, tasks_pb2

T = tasks_pb2
TEXTS = ["The first input.", "A second, different input text."]


def task_capability(ctx, task: str):
    """The model's advertised capability for ``task`` (embed, classify, score), or None."""
    mi = ctx.mi()
    cap = getattr(mi.tasks, task) if mi.HasField("tasks") else None
    return cap if cap is not None and cap.supported else None


def require_task(ctx, task: str):
    cap = task_capability(ctx, task)
    if cap is None:
        raise Skip(f"{task} not advertised")
    return cap


def task_input(ctx, cap, item_id: str, text: str) -> T.TaskInput:
    """``text`` as text, or as token ids where the task takes only those."""
    if not list(cap.input_types) or T.TASK_INPUT_TYPE_TEXT in cap.input_types:
        return T.TaskInput(item_id=item_id, text=text)
    if T.TASK_INPUT_TYPE_TOKEN_IDS in cap.input_types:
        return T.TaskInput(item_id=item_id, token_ids=input_pb2.TokenIds(ids=[1 + (ord(c) % 50) for c in text[:8]]))
    raise Skip("the task takes neither text nor token-id input")


def task_context(ctx, tag: str, **kw) -> T.TaskRequestContext:
    return T.TaskRequestContext(request_id=ctx.rid(tag), model=ctx.model, **kw)


def batch_request(ctx, task: str, cap, tag: str, inputs=None, **ctxkw):
    """The call of one small valid ``task`` request (default options), not yet awaited."""
    if inputs is None:
        inputs = [task_input(ctx, cap, f"item-{i}", t) for i, t in enumerate(TEXTS)]
    context = task_context(ctx, tag, **ctxkw)
    if task == "embed":
        return ctx.stub.Embed(embedding_pb2.EmbedRequest(context=context, inputs=inputs),
                              timeout=ctx.options.check_timeout_s)
    if task == "classify":
        return ctx.stub.Classify(classification_pb2.ClassifyRequest(context=context, inputs=inputs),
                                 timeout=ctx.options.check_timeout_s)
    groups = [scoring_pb2.ScoreGroup(group_id="g0", query=inputs[0], candidates=inputs[1:])] if inputs else []
    return ctx.stub.Score(scoring_pb2.ScoreRequest(context=context, groups=groups, options=score_options(cap)),
                          timeout=ctx.options.check_timeout_s)


def score_options(cap) -> scoring_pb2.ScoreOptions:
    """Native scoring where the model has it, else label-token scoring."""
    if native_score(cap):
        return scoring_pb2.ScoreOptions()
    return scoring_pb2.ScoreOptions(label_token_ids=[1, 2])


def native_score(cap) -> bool:
    native = {T.TASK_VALUE_SEMANTICS_SIMILARITY, T.TASK_VALUE_SEMANTICS_RELEVANCE, T.TASK_VALUE_SEMANTICS_LOGITS,
              T.TASK_VALUE_SEMANTICS_REWARD, T.TASK_VALUE_SEMANTICS_MODEL_DEFINED}
    return bool(native & set(cap.semantics)) or not cap.supports_label_token_scoring
