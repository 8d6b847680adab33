"""What the engine is and serves: GetEngineInfo, GetModelInfo, GetLoad, GetKvConnectorInfo,
GetKvEventSources."""

from __future__ import annotations

import dataclasses
import time

from openengine_adapters import schema
from openengine_adapters.backend import LoadSnapshot
from openengine_adapters.core.state import CoreState
from openengine_adapters.kv_events.sources import with_host
from openengine_adapters.messages import engine as engine_messages
from openengine_adapters.messages import kv as kv_messages
from openengine_adapters.messages import model as model_messages
from openengine_adapters.messages import observability as observability_messages
from openengine_adapters.types import Feature
from openengine_adapters.v1 import kv_pb2, model_pb2, observability_pb2
from openengine_adapters.validation.kv import WILDCARD_HOSTS

# the native KV-event source's topic: the RPC that serves it (v0.1.0's Control service)
NATIVE_KV_EVENTS_TOPIC = "openengine.v1.Control/SubscribeKvEvents"


class DiscoveryRpcs(CoreState):
    async def GetEngineInfo(self, request, context):
        return engine_messages.engine_info(
            self.identity, self.instance_id, self.catalog.supported_models,
            self.backend.kv_connector(), schema.SCHEMA_REVISION, schema.MINIMUM_CLIENT_REVISION,
            schema.SCHEMA_RELEASE)

    async def GetModelInfo(self, request: model_pb2.GetModelInfoRequest, context):
        card = self.catalog.resolve(request.model, required=True)
        return model_messages.model_info(card, self.identity.role)

    async def load_snapshot(self, include_per_rank: bool) -> LoadSnapshot:
        """The engine's load, always timestamped, with per-rank rows only when asked for."""
        self._require(Feature.LOAD, "GetLoad")
        snapshot = await self.backend.load(include_per_rank)
        if snapshot.timestamp_unix_nanos is None:
            snapshot = dataclasses.replace(snapshot, timestamp_unix_nanos=time.time_ns())
        if not include_per_rank and snapshot.ranks:
            snapshot = dataclasses.replace(snapshot, ranks=())
        # what the v0.1.0 reading accepted without applying, and the watchdogs' findings, once there are
        # any: the contract's place for them is the attributes map
        wd, extra = self.watchdog, self.leniency.attributes()
        if wd.stalled_streams:
            extra["openengine.stalled_streams_ended"] = wd.stalled_streams
        if wd.hung or wd.dead_reason:
            extra["openengine.engine_hung"] = True
        return dataclasses.replace(snapshot, attributes={**snapshot.attributes, **extra}) if extra else snapshot

    async def GetLoad(self, request: observability_pb2.GetLoadRequest, context):
        return observability_messages.load_info(await self.load_snapshot(request.include_per_rank), self.instance_id)

    async def GetKvConnectorInfo(self, request, context):
        return kv_messages.kv_connector_info(self.backend.kv_connector())

    async def GetKvEventSources(self, request: kv_pb2.GetKvEventSourcesRequest, context):
        return self.kv_event_sources(request)

    def kv_event_sources(self, request: kv_pb2.GetKvEventSourcesRequest,
                         native: bool = False) -> kv_pb2.GetKvEventSourcesResponse:
        """The engine's own publishers; with ``native`` (v0.1.0) our ``SubscribeKvEvents`` itself instead,
        one ``grpc``/``protobuf`` source per DP rank it serves ("transport: grpc, zmq"; "Clients should
        prefer SubscribeKvEvents when available"), so a client that discovers sources finds it. One source
        per rank: Dynamo's reader refuses a rank advertised twice (ai-dynamo/dynamo
        lib/sidecar/openengine/src/kv.rs @0cc34d99 ``discover_sources``), so an engine publisher is listed
        there only for a rank the native stream does not serve; revision 1 lists the publishers."""
        native = native and Feature.KV_EVENTS in self.backend.features and self.grpc_port is not None
        if not native:
            self._require(Feature.KV_EVENT_SOURCES, "GetKvEventSources")
        ranks = list(request.data_parallel_ranks)
        resp = kv_pb2.GetKvEventSourcesResponse()
        served: set[int] = set()
        if native:
            for rank in range(self.identity.parallelism.data_parallel_size or 1):
                if not ranks or rank in ranks:
                    served.add(rank)
                    resp.sources.add(transport="grpc", topic=NATIVE_KV_EVENTS_TOPIC, data_parallel_rank=rank,
                                     encoding="protobuf", endpoint_addr=kv_pb2.KvEndpoint(
                                         host=self.options.advertise_host, port=self.grpc_port, protocol="grpc"))
        if Feature.KV_EVENT_SOURCES not in self.backend.features:
            return resp
        for src in self.backend.kv_event_sources(ranks):
            if ranks and src.data_parallel_rank is not None and src.data_parallel_rank not in ranks:
                continue
            if served and (src.data_parallel_rank is None or src.data_parallel_rank in served):
                continue  # the native stream serves this rank (a rank-less publisher: every rank)
            msg = resp.sources.add()
            msg.CopyFrom(kv_messages.kv_event_source(src))
            if msg.endpoint_addr.host in WILDCARD_HOSTS:
                msg.endpoint_addr.host = self.options.advertise_host
            msg.replay_endpoint = with_host(msg.replay_endpoint, self.options.advertise_host)  # never a wildcard
        return resp

