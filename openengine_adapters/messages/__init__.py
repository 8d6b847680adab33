"""Seam dataclasses -> revision-1 messages, one module per ``v1/*_pb2`` file they build:
``presence`` (the generic copier), ``model`` (ModelInfo and the card rules), ``engine``
(EngineInfo), ``kv`` (connector info, session refs, KV event sources and batches) and
``observability`` (LoadInfo, runtime events)."""
