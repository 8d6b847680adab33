"""A deterministic fake of TensorRT-LLM 1.2's LLM API, faithful to the behaviours the adapter
depends on (see /work/shared/engines/trtllm.md and tensorrt_llm/executor/result.py):

- ``generate_async`` returns a ``RequestOutput`` at once; it is async-iterable and every engine
  response MUTATES it (the same object is yielded each time).
- Outputs are CUMULATIVE. With n > 1 each response updates ONE sequence: only that sequence's
  ``_last_*_len`` move, so the others' ``*_diff`` keep repeating their stale last diff.
- ``abort()`` ends the stream with finish_reason ``cancelled`` on every unfinished sequence.
- ``SamplingParams.max_tokens`` defaults to 32; None lets the worker deduce it from the engine's
  max_seq_len (``_deduce_max_tokens``), which ``LLM.args.max_seq_len`` does not show unless the
  user set it (the model config's length lives in the worker).
- With temperature, top_p and top_k all unset ``SamplingParams`` implies greedy decoding, and
  greedy with n > 1 is refused by its constructor.
- Stop strings / stop token ids finish with ``stop_reason``; unless include_stop_str_in_output the
  stop tokens are truncated from the final output (multi-token stops were streamed before).
- The model: at a position where it emits token b the raw logits are ``-0.25 * ((v - b) % VOCAB)``
  (``logits_row``), so b has rank 1 and every logprob is log_softmax of such a row.
- logprobs: list of dict token_id -> Logprob(logprob, rank), top-k plus the sampled token;
  prompt_logprobs: entry i is the distribution after prompt position i (scores token i + 1), top k
  only (1.2.x adds no prompt token to the dict; here the prompt token happens to be the top one).
- ``return_generation_logits``: ``CompletionOutput.generation_logits`` is a [tokens, VOCAB]
  tensor of the raw logits at each generated position (a ``Tensor`` with torch's ``tolist``);
  skipped (left None) with speculative decoding.
- Guided decoding is enforced (``guided.py``): the output satisfies the constraint and ends with
  EOS (finish "stop") once it is complete; an invalid constraint fails the request's stream.
- ``cached_tokens`` from a block-reuse prefix cache (``tokens_per_block`` blocks, keyed by cache_salt,
  one cache per attention-DP rank).
- ``get_stats_async(timeout)`` / ``get_kv_cache_events_async(timeout)``: single-consumer queues
  that drain on read and end after ``timeout`` without data.
- LoRA adapters load lazily on first use; DisaggregatedParams context_only / generation_only.

Tokenizer: one character = one token (``ord``), BOS 1, EOS 2.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import queue
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .guided import constrained_text

__version__ = "1.2.0"
BOS, EOS = 1, 2
TEXT = "hello world. "
BLOCK = 4
VOCAB = 512
SLOPE = 0.25
_LSE = math.log(sum(math.exp(-SLOPE * j) for j in range(VOCAB)))


MODEL_MAX_POSITIONS = 256  # the fake model's config.json max_position_embeddings
_MODEL_DIR: str | None = None


def _model_dir() -> str:
    """The checkpoint directory ``LLM._hf_model_dir`` names: here only its config.json."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        import tempfile

        _MODEL_DIR = tempfile.mkdtemp(prefix="fake-trtllm-model-")
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": MODEL_MAX_POSITIONS,
                       "vocab_size": VOCAB}, f)
    return _MODEL_DIR


class Tokenizer:
    """llmapi/tokenizer.py TransformersTokenizer: eos_token_id and pad_token_id, no bos_token_id;
    ``encode`` adds the model's special tokens (BOS here) unless told not to."""

    eos_token_id = EOS
    pad_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i > 2)


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: Any = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        used = sum(bool(v) for v in (self.json, self.regex, self.grammar, self.json_object, self.structural_tag))
        if used > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {used}.")


class SamplingParams:
    FIELDS = {"max_tokens": 32, "n": 1, "temperature": None, "top_p": None, "top_k": None, "min_p": None,
              "frequency_penalty": None, "presence_penalty": None, "repetition_penalty": None, "seed": None,
              "min_tokens": None, "stop": None, "stop_token_ids": None, "ignore_eos": False,
              "include_stop_str_in_output": False, "logprobs": None, "prompt_logprobs": None,
              "guided_decoding": None, "best_of": None, "return_generation_logits": False, "detokenize": True}

    def __init__(self, **kw):
        unknown = set(kw) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"unexpected SamplingParams fields {sorted(unknown)}")
        for k, v in self.FIELDS.items():
            setattr(self, k, kw.get(k, v))
        self.explicit = frozenset(kw)
        if self.n < 1:
            raise ValueError("n must be >= 1")
        self.best_of = self.best_of or self.n
        # tensorrt_llm/sampling_params.py SamplingParams._validate: greedy with best_of > 1 is refused
        if self.best_of > 1 and self._greedy_decoding and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING"):
            raise ValueError(f"Greedy decoding in the LLM API does not allow multiple returns. Please set to "
                             f"best_of=1, got best_of={self.best_of}.")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()

    @staticmethod
    def params_imply_greedy_decoding(*, temperature, top_p, top_k) -> bool:
        """tensorrt_llm/sampling_params.py: all three unset IS greedy (not "the engine's default")."""
        return ((temperature is None and top_p is None and top_k is None) or top_k == 1 or top_p == 0.0
                or temperature == 0)

    @property
    def _greedy_decoding(self) -> bool:
        return self.params_imply_greedy_decoding(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


@dataclass(slots=True, kw_only=True)  # tensorrt_llm/disaggregated_params.py: keyword-only
class DisaggregatedParams:
    """The 1.2 fields the adapter uses (later releases add disagg_request_id, ctx_dp_rank,
    ctx_info_endpoint, ...; the adapter reads the field list from the signature)."""

    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None

    def __post_init__(self):
        # disaggregated_params.py DisaggregatedParams.__post_init__: lower-cased, one of three
        if self.request_type is not None:
            self.request_type = self.request_type.lower()
            if self.request_type not in ("context_only", "generation_only", "context_and_generation"):
                raise ValueError(f"Unknown request type: {self.request_type}. Must be context_only, "
                                 "generation_only or context_and_generation")


@dataclass(slots=True)
class SchedulingParams:
    attention_dp_rank: int | None = None
    attention_dp_relax: bool = True


@dataclass(slots=True)
class LoRARequest:
    """executor/request.py LoRARequest: positional (name, id, path), checked when built."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self):
        # executor/request.py LoRARequest.__post_init__
        if self.lora_path is not None and not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source not in ("hf", "nemo"):
            raise ValueError(f"lora_ckpt_source must be 'hf' or 'nemo', got '{self.lora_ckpt_source}'")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path


@dataclass
class KvCacheConfig:
    """llmapi/llm_args.py KvCacheConfig defaults: 32 tokens per block, no KV-event buffer."""

    free_gpu_memory_fraction: float = 0.9
    enable_block_reuse: bool = True
    event_buffer_max_size: int = 0
    tokens_per_block: int = 32


@dataclass
class CacheTransceiverConfig:
    backend: str = "DEFAULT"


@dataclass
class LoraConfig:
    max_lora_rank: int = 64
    max_loras: int = 4
    max_cpu_loras: int = 8
    lora_target_modules: list | None = None


@dataclass
class Args:
    model: str = "fake-model"
    # llmapi/llm_args.py: None unless the user passes it; the PyTorch worker takes the model's length
    # (create_py_executor) and keeps it to itself (executor/base_worker.py setup_engine: self.max_seq_len)
    max_seq_len: int | None = None
    max_batch_size: int = 2048  # llmapi/llm_args.py BaseLlmArgs defaults
    max_num_tokens: int = 8192
    enable_chunked_prefill: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_attention_dp: bool = False
    enable_iter_perf_stats: bool = True
    # the tests' deployment (not TensorRT-LLM's default): KV events on, 4-token blocks so that
    # short prompts fill blocks
    kv_cache_config: KvCacheConfig = field(default_factory=lambda: KvCacheConfig(event_buffer_max_size=64,
                                                                                 tokens_per_block=BLOCK))
    lora_config: LoraConfig | None = None
    guided_decoding_backend: str | None = "xgrammar"
    cache_transceiver_config: CacheTransceiverConfig | None = None
    speculative_config: Any = None
    # llmapi/llm_args.py TorchLlmArgs: the overlap scheduler is on unless disabled; with it on, the
    # worker refuses context-only requests (see LLM._enqueue_checks)
    disable_overlap_scheduler: bool = False
    sampler_type: str = "auto"  # llmapi/llm_args.py TorchLlmArgs: auto = TorchSampler (no beam search)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    disaggregated_params: DisaggregatedParams | None = None
    generation_logits: Tensor | None = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> list:
        return self.logprobs[self._last_logprobs_len:]


class _Queue:
    """A single-consumer, drain-on-read queue; bounded (oldest dropped) like the engine's, read
    through ONE ``IterationResult`` (executor/result.py): once a read times out it stays done,
    ending every later iteration at once, until ``mark_undone`` - which the executor calls only
    when a new request is submitted (executor/executor.py _maybe_initialize_iteration_results)."""

    def __init__(self, maxlen: int | None = None):
        self.items: deque = deque(maxlen=maxlen)
        self.event = asyncio.Event()
        self._done = False
        self._timeout = 2.0

    def put(self, item) -> None:
        self.items.append(item)
        self.event.set()

    def set_timeout(self, timeout: float) -> _Queue:
        self._timeout = timeout
        return self

    def mark_undone(self) -> None:
        self._done = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        while not self.items:
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), self._timeout)
            except TimeoutError:
                self._done = True
                raise StopAsyncIteration from None
        return self.items.popleft()


async def _empty():
    return
    yield


class _Executor:
    """The LLM's executor as a death leaves it (1.2, executor/proxy.py ``ExecutorBindingsProxy``):
    one MPI future per worker process (``mpi_futures``, from ``mpi_session.submit(worker_main)``);
    a worker that dies completes its future with the error, which ``mpi_done_callback`` puts on
    ``_error_queue``; the next ``_handle_background_error`` (executor.py) takes it and calls
    ``self.shutdown()``, so ``doing_shutdown`` turns True while the LLM keeps its executor."""

    def __init__(self, workers: int = 1) -> None:
        self.doing_shutdown = False
        self._error_queue: queue.Queue = queue.Queue()
        self.mpi_futures = [concurrent.futures.Future() for _ in range(workers)]
        for f in self.mpi_futures:
            f.set_running_or_notify_cancel()

    def worker_died(self, error: BaseException, rank: int = 0) -> None:
        self.mpi_futures[rank].set_exception(error)  # the MPI pool's future of worker_main
        self._error_queue.put_nowait(error)  # proxy.py mpi_done_callback
        self.doing_shutdown = True  # executor.py _handle_background_error -> self.shutdown()


class RequestError(RuntimeError):
    """tensorrt_llm/executor/utils.py RequestError: what the worker raises for a request it refuses."""


class Tensor(list):
    """A row-major stand-in for the torch tensors TensorRT-LLM returns (``tolist`` and rows)."""

    def tolist(self) -> list:
        return [r.tolist() if isinstance(r, Tensor) else r for r in self]


def logits_row(token: int) -> Tensor:
    """The raw logits at a position where the fake model emits (or reads) ``token``: its favourite."""
    return Tensor(-SLOPE * ((v - token) % VOCAB) for v in range(VOCAB))


def logprob(rank: int) -> float:
    """log_softmax of ``logits_row`` at the token of this rank (1 = the favoured one)."""
    return -SLOPE * (rank - 1) - _LSE


def _topk(best: int, k: int) -> dict[int, Logprob]:
    return {best + r: Logprob(logprob(r + 1), r + 1) for r in range(k)}


class RequestOutput:
    def __init__(self, llm: LLM, request_id: int, prompt_ids: list[int], sp: SamplingParams):
        self._llm = llm
        self.request_id = request_id
        self.prompt_token_ids = prompt_ids
        self.sampling_params = sp
        self.outputs = [CompletionOutput(i) for i in range(sp.n)]
        self.finished = False
        self.cached_tokens = 0
        if sp.prompt_logprobs:
            # one entry per context-logits row, i.e. per prompt token (executor/base_worker.py
            # _compute_pytorch_prompt_logprobs -> result.py compute_logprobs): entry i is the
            # distribution after prompt token i, so the last one is that of the first output token
            self.outputs[0].prompt_logprobs = [_topk(prompt_ids[i + 1] if i + 1 < len(prompt_ids)
                                                     else ord(TEXT[0]), sp.prompt_logprobs)
                                               for i in range(len(prompt_ids))]
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.aborted = False

    def abort(self) -> None:
        """Ends a running request. A finished one is already gone from the worker (executor/base_worker.py
        abort_request: "Request of client_id ... is finished, cannot abort it." and returns): aborting
        a finished context-only request frees nothing; its KV blocks wait for the transfer."""
        self.aborted = True
        self._llm.abort_calls.append(self.request_id)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.finished = True
            raise item
        self._apply(*item)
        return self

    def __await__(self):
        async def run():
            async for _ in self:
                pass
            return self
        return run().__await__()

    def _apply(self, idx, new_ids, new_lps, reason, stop_reason, final, disagg):
        """One engine response, as executor/result.py GenerationResultBase._handle_response /
        _handle_sequence and DetokenizedGenerationResultBase._handle_response apply it:

        - only sequence ``idx`` is updated (its ``_last_*_len`` move);
        - a finish reason other than ``cancelled`` (and the stop-word truncation of token_ids) is
          set only when the REQUEST is final (``if self._done:``), and then only on the sequence of
          that response: with n > 1 the sequences that finished earlier never get one;
        - with ``detokenize`` (the default) every output's text gets ``decode(token_ids_diff)``
          appended, so a sequence this response did not update re-appends its stale last diff, and
          text once appended is never taken back (a stop string's prefix survives the truncation).
        """
        out = self.outputs[idx]
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        out.token_ids.extend(new_ids)
        if self.sampling_params.logprobs is not None:
            out.logprobs.extend(new_lps)
        if self.sampling_params.return_generation_logits and self._llm.args.speculative_config is None:
            out.generation_logits = Tensor([*(out.generation_logits or []), *map(logits_row, new_ids)])
        if reason == "cancelled" or (reason is not None and final):
            out.finish_reason, out.stop_reason = reason, stop_reason
            if reason == "stop" and stop_reason is not None and not self.sampling_params.include_stop_str_in_output:
                cut = len(self._llm.stop_ids(stop_reason))
                del out.token_ids[len(out.token_ids) - cut:]
                del out.logprobs[len(out.token_ids):]
                if out.generation_logits is not None:
                    out.generation_logits = Tensor(out.generation_logits[:len(out.token_ids)])
        out.disaggregated_params = disagg
        if self.sampling_params.detokenize:
            for o in self.outputs:
                o._last_text_len = len(o.text)
                o.text += self._llm.tokenizer.decode(o.token_ids_diff)
        if final:
            self.finished = True


class LLM:
    def __init__(self, args: Args | None = None, **kwargs):
        if args is None:  # built like the real LLM(model=..., max_seq_len=..., ...): the keywords Args knows
            known = {f.name for f in dataclasses.fields(Args)}
            args = Args(**{k: v for k, v in kwargs.items() if k in known})
        self.args = args
        self.init_kwargs = kwargs
        self.step_s = float(os.environ.get("FAKE_TRTLLM_STEP_S", "0"))  # engine step time (tests set it)
        self.tokenizer = Tokenizer()
        self.eos_after: int | None = None
        self.ids = itertools.count(100)
        self.live: dict[int, RequestOutput] = {}
        self.abort_calls: list[int] = []
        self.submitted: list[dict] = []
        self.lora_loaded: dict[int, str] = {}
        self.lora_loads: list[int] = []
        self.context_sessions: dict[int, list[int]] = {}
        self.cache: set[tuple] = set()
        self.iteration = 0
        kv = self.args.kv_cache_config
        self.kv_queue = _Queue(kv.event_buffer_max_size or None)
        self.stats_queue = _Queue(1000)
        self.event_id = itertools.count(0)  # rank 0's (or the only) KV event ids
        self._rank_event_ids: dict[int, itertools.count] = {}
        self.dp_size = self.args.tensor_parallel_size if self.args.enable_attention_dp else 1
        self.rank_of: dict[int, int] = {}  # request id -> the attention-DP rank that runs it
        self.shut = False
        self._executor = _Executor(self.args.tensor_parallel_size * self.args.pipeline_parallel_size)
        self.worker_dead = False  # a worker process died: nothing answers any more (see die)
        self.stalled = False  # the executor loop is blocked on a handoff it cannot resolve
        self.fail_after: int | None = None  # tests: fail a request after this many engine steps
        # the worker's max_seq_len: the user's, else the model config's (create_py_executor)
        self.engine_max_seq_len = self.args.max_seq_len or MODEL_MAX_POSITIONS
        self._hf_model_dir = _model_dir()
        # the C++ WindowBlockManager constructor enqueues "created" (event id 0, per attention-DP
        # rank: kvCacheManager.cpp, kvCacheEventManager.cpp enqueueCreatedEvent); it waits in the
        # engine's buffer, and the LLM reads it only once a request has created its IterationResult
        # (get_kv_cache_events_async asserts before that; proxy.py starts its dispatch threads in submit)
        if kv.event_buffer_max_size:
            for rank in range(self.dp_size):
                self.emit_kv({"type": "created", "num_blocks_per_cache_level": [128, 0]},
                             rank if self.args.enable_attention_dp else None)

    # -- engine queues ----------------------------------------------------------
    def emit_kv(self, data: dict, rank: int | None = None) -> None:
        if self.args.kv_cache_config.event_buffer_max_size:
            # each rank's KVCacheEventManager numbers its own events (gathered to rank 0 under attention DP)
            ids = self.event_id if not rank else self._rank_event_ids.setdefault(rank, itertools.count(0))
            ev = {"event_id": next(ids), "data": data, "window_size": 64}
            if rank is not None:
                ev["attention_dp_rank"] = rank
            self.kv_queue.put(ev)

    def restart_kv(self) -> None:
        """The engine recreated its cache (e.g. restarted): event ids start over."""
        self.event_id = itertools.count(0)
        self._rank_event_ids.clear()
        self.cache.clear()
        self.emit_kv({"type": "created", "num_blocks_per_cache_level": [128, 0]})

    def get_kv_cache_events_async(self, timeout: float = 2):
        # executor/executor.py aget_kv_events: the IterationResult exists only once a request was
        # submitted; before that: AssertionError("KV Event IterationResult is not properly instantiated.")
        assert self.submitted, "KV Event IterationResult is not properly instantiated."
        return self.kv_queue.set_timeout(timeout)

    def get_stats_async(self, timeout: float = 2):
        # executor/executor.py aget_stats: an empty iterable before the first request. Items are
        # dicts: the worker serializes IterationStats.to_json_str() (worker.py dispatch_stats_task)
        # and result.py IterationResult.__anext__ returns json.loads(data)
        return self.stats_queue.set_timeout(timeout) if self.submitted else _empty()

    def die(self, error: BaseException | None = None) -> None:
        """Tests: a worker process dies (CUDA error, OOM kill). In-flight requests get no further
        response, not even to an abort: proxy.py's dispatch_result_thread blocks on a result queue
        that the dead worker no longer feeds."""
        self.worker_dead = True
        self._executor.worker_died(error or RuntimeError("MPI worker exited unexpectedly"))

    def shutdown(self) -> None:
        """llmapi/llm.py shutdown: the executor is shut down and dropped (``self._executor = None``)."""
        self.shut = True
        self._executor = None

    # -- helpers ------------------------------------------------------------------
    def stop_ids(self, stop_reason) -> list[int]:
        if isinstance(stop_reason, str):
            return self.tokenizer.encode(stop_reason, add_special_tokens=False)
        return [stop_reason]

    def _prefix_cache(self, ids: list[int], salt: str | None, lora: int, rank: int) -> int:
        """Block reuse on the request's attention-DP rank (each rank has its own KV cache)."""
        block = self.args.kv_cache_config.tokens_per_block
        cached, parent, first_parent = 0, None, None
        stored = []
        for b in range(len(ids) // block):
            blk = tuple(ids[b * block:(b + 1) * block])
            key = (rank, salt, lora, parent, blk)
            h = zlib.crc32(repr(key).encode())
            if key in self.cache:
                if cached == b * block:
                    cached += block
            else:
                self.cache.add(key)
                if not stored:
                    first_parent = parent
                # no lora_id: _utils.py KVCacheEventSerializer._stored_block_to_json leaves it out
                # ("TODO: enable serialization of lora_id")
                stored.append({"type": "stored_block", "block_hash": h, "cache_level": 0,
                               "priority": 35, "tokens": [{"type": "unique_token", "token_id": t,
                                                           "token_extra_id": 0} for t in blk]})
            parent = h
        if stored:
            self.emit_kv({"type": "stored", "parent_hash": first_parent, "blocks": stored},
                         rank if self.args.enable_attention_dp else None)
        return cached

    def _stats(self) -> None:
        """One iteration's stats, as rank 0 sees them: PyExecutor.get_latest_iteration_stats returns
        its own rank's IterationStats (_torch/pyexecutor/py_executor.py _get_init_iter_stats:
        ``num_active_requests = len(self.active_requests)``; _update_iter_stats: this rank's KV cache
        manager), and only rank 0's worker forwards them (executor/worker.py start:
        ``if mpi_rank() == 0: ... dispatch_stats_thread``), so with attention DP the counts and KV
        blocks are attention-DP rank 0's alone."""
        self.iteration += 1
        active = sum(1 for rid, r in self.live.items() if not r.finished and self.rank_of.get(rid, 0) == 0)
        # a dict: executor/result.py IterationResult.__anext__ returns json.loads(data)
        self.stats_queue.put({
            "iter": self.iteration, "iterLatencyMS": 1.5, "numActiveRequests": active, "numQueuedRequests": 0,
            "kvCacheStats": {"maxNumBlocks": 128, "usedNumBlocks": 4 * active,
                             "tokensPerBlock": self.args.kv_cache_config.tokens_per_block},
            "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": active, "numCtxTokens": 0,
                                      "numScheduledRequests": active}})

    # -- the API --------------------------------------------------------------------
    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, lora_request=None,
                       prompt_adapter_request=None, streaming: bool = False, kv_cache_retention_config=None,
                       disaggregated_params: DisaggregatedParams | None = None, _postproc_params=None,
                       scheduling_params: SchedulingParams | None = None, cache_salt: str | None = None,
                       trace_headers=None):
        # llmapi/llm.py generate_async: trace_headers came with OpenTelemetry tracing (TensorRT-LLM
        # PR #5897, 2025, with llm_args otlp_traces_endpoint); the 1.1-era signature ends at
        # cache_salt (the adapter inspects the signature; tests cover both)
        if self._executor is None:  # llmapi/llm.py generate_async, after shutdown
            raise RuntimeError("LLM is shutting down")
        sp = sampling_params or SamplingParams()
        if isinstance(inputs, str):
            ids = self.tokenizer.encode(inputs)
        else:
            ids = list(inputs["prompt_token_ids"])
        if not ids:
            raise ValueError("prompt is empty")
        gen_only = disaggregated_params is not None and disaggregated_params.request_type == "generation_only"
        if not self.args.enable_chunked_prefill and not gen_only and len(ids) > self.args.max_num_tokens:
            # llmapi/llm.py _check_arguments (PyTorch backend): the prompt must fit one forward pass
            raise ValueError(f"The sum of prompt length ({float(len(ids))}), query length (0) should not exceed "
                             f"max_num_tokens ({self.args.max_num_tokens})")
        if scheduling_params is not None and not self.args.enable_attention_dp:
            raise ValueError("attention_dp_rank needs enable_attention_dp")
        if lora_request is not None and self.args.lora_config is None:
            raise ValueError("LoRA is not enabled")
        rid = next(self.ids)
        # attention DP: the requested rank, else the scheduler's choice (round robin here)
        self.rank_of[rid] = (scheduling_params.attention_dp_rank if scheduling_params is not None
                             and scheduling_params.attention_dp_rank is not None else rid % self.dp_size)
        out = RequestOutput(self, rid, ids, sp)
        self.kv_queue.mark_undone()  # _maybe_initialize_iteration_results, on every submission
        self.stats_queue.mark_undone()
        self.submitted.append({"id": rid, "inputs": inputs, "sp": sp, "lora": lora_request, "streaming": streaming,
                               "disagg": disaggregated_params, "sched": scheduling_params, "salt": cache_salt,
                               "trace": trace_headers})
        self.live[rid] = out
        out._task = asyncio.get_running_loop().create_task(self._run(out, lora_request, disaggregated_params,
                                                                     cache_salt))
        return out

    def _deduce_max_tokens(self, max_tokens: int | None, prompt_len: int) -> int:
        """executor/base_worker.py ``_deduce_max_tokens`` (PyTorch backend): the room left in the
        worker's max_seq_len; an explicit max_tokens beyond it is silently clamped (a warning in the
        worker's log). The PyTorch LLM checks no length itself (llmapi/llm.py ``_check_arguments``
        returns at once for the pytorch backend). A prompt that leaves no room with max_tokens None
        is refused there (a RequestError, on the stream: see ``_enqueue_checks``)."""
        room = self.engine_max_seq_len - prompt_len
        if room <= 0:
            if max_tokens is None:
                raise RequestError("`max_tokens` must be set when `default_max_tokens` is illegal")
            return max_tokens
        return room if max_tokens is None or max_tokens > room else max_tokens

    def _enqueue_checks(self, disagg: DisaggregatedParams | None) -> None:
        """What the worker checks when it enqueues a request (``executor/base_worker.py``
        ``BaseWorker._enqueue_request``). The LLM runs its worker behind a proxy
        (``executor/proxy.py``), so a refusal there does not raise from ``generate_async``:
        ``worker.py`` ``worker_main`` catches the ``RequestError`` and answers with an
        ``ErrorResponse``, and the request's stream raises it on the first read."""
        if disagg is None:
            return
        if self.args.cache_transceiver_config is None:
            raise RequestError("kv_cache_transceiver is disabled, please set 'cache_transceiver_config: "
                               "backend:<backend_type>` in config file for disaggregated serving")
        if disagg.request_type == "context_only" and not self.args.disable_overlap_scheduler:
            raise RequestError("Context only requests are not supported in pytorch backend when overlap is enabled.")

    async def _run(self, out: RequestOutput, lora, disagg, salt) -> None:
        sp = out.sampling_params
        done = [False] * sp.n
        try:
            self._enqueue_checks(disagg)
            budget = self._deduce_max_tokens(sp.max_tokens, len(out.prompt_token_ids))
            while self.stalled:  # see the generation_only branch below
                await asyncio.sleep(3600)
            shift = 0
            if lora is not None:
                if lora.lora_int_id not in self.lora_loaded:  # lazy: weights read on first use
                    if not os.path.isfile(os.path.join(lora.lora_path, "adapter_config.json")):
                        raise RuntimeError(f"cannot load LoRA {lora.lora_path}")
                    self.lora_loaded[lora.lora_int_id] = lora.lora_path
                    self.lora_loads.append(lora.lora_int_id)
                shift = lora.lora_int_id
            first: list[int] = []
            if disagg is not None and disagg.request_type == "generation_only":
                if not disagg.opaque_state:
                    # 1.2: opaque_state is what locates the context worker; the generation worker
                    # consumes the handoff on its executor loop with no timeout, so without it the
                    # whole engine waits forever (tensorrt_llm/grpc/openengine/disagg.py
                    # _validate_kv_session: "blocks that loop indefinitely, so every later request
                    # on this engine stalls too")
                    self.stalled = True
                    while True:
                        await asyncio.sleep(3600)
                if disagg.ctx_request_id not in self.context_sessions:
                    raise RuntimeError(f"no context for ctx_request_id {disagg.ctx_request_id}")
                del self.context_sessions[disagg.ctx_request_id]
                first = list(disagg.first_gen_tokens)
            if sp.guided_decoding is not None and sp.guided_decoding.structural_tag \
                    and self.args.guided_decoding_backend == "llguidance":
                # the llguidance grammar backend has no structural-tag matcher
                # (tensorrt_llm/grpc/openengine/capabilities.py GUIDE_SUPPORT_BY_BACKEND)
                raise RuntimeError("structural tags are not supported by the llguidance backend")
            guided = constrained_text(sp.guided_decoding)
            out.cached_tokens = self._prefix_cache(out.prompt_token_ids, salt, lora.lora_int_id if lora else 0,
                                                   self.rank_of.get(out.request_id, 0))
            n = sp.n
            made = [0] * n
            produced = [list(first) for _ in range(n)]
            # The 1.2 PyTorch backend samples with TorchSampler unless sampler_type is TRTLLMSampler
            # (llmapi/llm_args.py TorchLlmArgs.sampler_type: "auto ... will use TorchSampler unless
            # BeamSearch is requested"). TorchSampler (_torch/pyexecutor/sampler.py) applies no
            # repetition/presence/frequency penalty, no min_p and no per-request seed: they are
            # accepted and ignored (penalties came to it only with _OccurrencePenaltyHandler, 2026).
            # The C++ decoder behind TRTLLMSampler honours them; here a seed moves the text and a
            # penalty shifts it by one.
            honours = str(getattr(self.args.sampler_type, "value", self.args.sampler_type)) == "TRTLLMSampler"
            seed = (sp.seed or 0) if honours else 0
            if honours and any(v not in (None, 0, 0.0, 1.0) for v in (
                    sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty)):
                shift += 1
            step = 0
            pending = [list(first) for _ in range(n)]  # generation_only: the context's first token(s)
            if first:
                for i in range(n):
                    made[i] = len(first)
            while not all(done):
                for i in range(n):
                    if done[i]:
                        continue
                    await asyncio.sleep(self.step_s)
                    while self.worker_dead:  # see die
                        await asyncio.sleep(3600)
                    step += 1
                    burst = 2 if step % 3 == 0 else 1
                    new, lps, reason, stop_reason = pending[i], [None] * len(pending[i]), None, None
                    pending[i] = []
                    for _ in range(burst):
                        t = made[i]
                        if self.eos_after is not None and t >= self.eos_after and not sp.ignore_eos \
                                and t >= (sp.min_tokens or 0):
                            reason = "stop"
                            break
                        if guided is not None and t >= len(guided):
                            reason = "stop"  # the constraint is complete: only EOS is allowed
                            break
                        tok = ord(guided[t] if guided is not None else TEXT[(t + 3 * i + seed + shift) % len(TEXT)])
                        new.append(tok)
                        produced[i].append(tok)
                        lps.append(_topk(tok, sp.logprobs) if sp.logprobs else None)
                        made[i] += 1
                        if t + 1 >= (sp.min_tokens or 0):
                            if sp.stop_token_ids and tok in sp.stop_token_ids:
                                reason, stop_reason = "stop", tok
                                break
                            stops = [sp.stop] if isinstance(sp.stop, str) else (sp.stop or [])
                            hit = next((s for s in stops
                                        if produced[i][-len(s):] == self.stop_ids(s)), None)
                            if hit is not None:
                                reason, stop_reason = "stop", hit
                                break
                        if made[i] >= budget:
                            reason = "length"
                            break
                    if disagg is not None and disagg.request_type == "context_only" and reason is None:
                        reason = "length"
                    if reason is not None:
                        done[i] = True
                    dp = None
                    if disagg is not None and disagg.request_type == "context_only":
                        self.context_sessions[out.request_id] = out.prompt_token_ids
                        dp = DisaggregatedParams(request_type="context_only", first_gen_tokens=list(produced[i]),
                                                 ctx_request_id=out.request_id,
                                                 opaque_state=b"\x00state-" + str(out.request_id).encode())
                    out._queue.put_nowait((i, new, lps, reason, stop_reason, all(done), dp))
                    self._stats()
                    if self.fail_after is not None and step >= self.fail_after and not all(done):
                        raise RuntimeError("engine failure mid-stream (test)")
        except asyncio.CancelledError:
            if self.worker_dead:  # see die
                return
            # abort: every unfinished sequence ends "cancelled" in one final response each
            unfinished = [i for i in range(sp.n) if not done[i]]
            for k, i in enumerate(unfinished):
                out._queue.put_nowait((i, [], [], "cancelled", None, k == len(unfinished) - 1, None))
        except Exception as exc:
            # every per-request error reaches the stream as a RequestError: the worker's ErrorResponse
            # -> GenerationResult._handle_response -> executor.py _handle_background_error(str)
            out._queue.put_nowait(exc if isinstance(exc, RequestError) else RequestError(str(exc)))
        finally:
            self.live.pop(out.request_id, None)
