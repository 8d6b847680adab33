"""What every engine adapter needs and no engine defines: the shared engine kit.

- ``outputs``: finish stamping, logprob values, cumulative-to-delta slicing with stop-prefix holdback;
- ``sessions``: the bounded table of handed-off prefill sessions (lease, capacity, single-use decode)
  and the prompt seal that refuses a decode of another prompt;
- ``card``: capability-card fragments and the feature set derived from a card;
- ``scores``: score results from per-pair values (label-token scoring, cross-encoder relevance);
- ``guided``: a guided-decoding constraint as engine keyword arguments (vLLM, TensorRT-LLM; SGLang's choice regex);
- ``stop_text``: how much trailing text may be the start of a stop string (held back by cumulative translators).

The ZMQ KV-event publisher wiring lives with the bridge, in ``kv_events.publishers``.
An adapter keeps only its engine's work (request mapping, engine calls, engine quirks).
"""
