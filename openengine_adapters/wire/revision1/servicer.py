"""Revision 1 on the wire: the core speaks its messages, so the core is registered as the servicer."""

from __future__ import annotations

import grpc

from openengine_adapters.core.service import EngineService
from openengine_adapters.v1 import openengine_pb2, openengine_pb2_grpc

SERVICE = openengine_pb2.DESCRIPTOR.services_by_name["OpenEngine"].full_name


def register(core: EngineService, server: grpc.aio.Server) -> tuple[str, ...]:
    """Serve ``openengine.v1.OpenEngine`` from ``core``; return the service names added."""
    openengine_pb2_grpc.add_OpenEngineServicer_to_server(core, server)
    return (SERVICE,)
