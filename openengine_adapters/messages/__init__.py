"""Seam dataclasses -> revision-1 messages, one module per domain (as ``backend/`` is laid out):
``presence`` (the generic copier), ``model`` (ModelInfo and the card rules), ``engine``
(EngineInfo), ``kv`` (connector info, session refs, KV event sources and batches),
``observability`` (LoadInfo, runtime events) and ``tasks`` (the Embed, Classify and Score
responses, every output checked against the contract)."""
