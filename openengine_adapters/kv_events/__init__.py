"""Engine-agnostic KV-event bridge: engine-native ZMQ/msgpack publishers -> typed OpenEngine batches."""

from openengine_adapters.kv_events.bridge import KvEventBridge, split_blocks
from openengine_adapters.kv_events.decode import DecodeError, DecodeStats, decode_batch, decode_event
from openengine_adapters.kv_events.sources import PublisherConfig, source_info

__all__ = ["DecodeError", "DecodeStats", "KvEventBridge", "PublisherConfig", "decode_batch", "decode_event",
           "source_info", "split_blocks"]
