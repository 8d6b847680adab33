"""Revision 1 on the wire: the core speaks its messages, so each RPC is the core's method of the same name.

Registered by hand (not ``add_OpenEngineServicer_to_server``) so that bytes which do not decode are
answered INVALID_ARGUMENT with the error trailer (``wire.decode``), as the contract asks.
"""

from __future__ import annotations

import grpc
from google.protobuf import message_factory

from openengine_adapters.core.service import EngineService
from openengine_adapters.v1 import openengine_pb2
from openengine_adapters.wire.decode import method_handler

SERVICE = openengine_pb2.DESCRIPTOR.services_by_name["OpenEngine"].full_name


def register(core: EngineService, server: grpc.aio.Server) -> tuple[str, ...]:
    """Serve ``openengine.v1.OpenEngine`` from ``core``; return the service names added."""
    methods = {
        m.name: method_handler(f"/{SERVICE}/{m.name}", getattr(core, m.name),
                               message_factory.GetMessageClass(m.input_type), m.server_streaming)
        for m in openengine_pb2.DESCRIPTOR.services_by_name["OpenEngine"].methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    return (SERVICE,)
