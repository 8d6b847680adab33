"""Engine-agnostic KV-event bridge: engine-native ZMQ/msgpack publishers -> typed OpenEngine batches.

- ``bridge``: the subscriber over every publisher, bridged into SubscribeKvEvents;
- ``decode``: an engine's msgpack event batch -> typed batches;
- ``sources``: publisher configuration and what GetKvEventSources names;
- ``publishers``: ``ZmqKvEvents``, the wiring an engine adapter holds (bridge start/stop, sources, subscriptions).
"""

from openengine_adapters.kv_events.bridge import KvEventBridge, split_blocks
from openengine_adapters.kv_events.msgpack_decoding import DecodeError, DecodeStats, decode_batch, decode_event
from openengine_adapters.kv_events.sources import PublisherConfig, source_info

__all__ = ["DecodeError", "DecodeStats", "KvEventBridge", "PublisherConfig", "decode_batch", "decode_event",
           "source_info", "split_blocks"]
