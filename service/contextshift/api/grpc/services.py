"""Services as gRPC handlers: each method of a service descriptor served by the transport-neutral
method of the same name (a request message in, its response out), and server reflection that also
finds methods by their full names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from grpc import aio

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service.servicer import ENCODED_METHODS, ContextShiftService

CONTEXT_SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]


def _behavior(
    method: Callable[[Any], Awaitable[Any]],
) -> Callable[[Any, aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    """A neutral method as a gRPC behavior, which also takes the call's context (the interceptor
    has served what the service needs of it: the key, the errors)."""

    async def behavior(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await method(request)

    return behavior


def add_service(
    server: aio.Server, servicer: object, service: ServiceDescriptor, encoded: Set[str] = frozenset()
) -> None:
    """Serves every method of `service` from the servicer's method of the same name, as the
    generated `add_*Servicer_to_server` does, except that the methods in `encoded` take and
    return encoded messages (bytes), with no (de)serializer in between."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        behavior = _behavior(getattr(servicer, method.name))
        if method.name in encoded:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(behavior)
        else:
            request_type = message_factory.GetMessageClass(method.input_type)
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                behavior,
                request_deserializer=request_type.FromString,
                response_serializer=lambda response: response.SerializeToString(),
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def add_context_service(service: ContextShiftService, server: aio.Server) -> None:
    add_service(server, service, CONTEXT_SERVICE, ENCODED_METHODS)


class MethodResolvingPool:
    """The default descriptor pool as server reflection reads it, where `file_containing_symbol`
    also finds a method by its full name (`contextshift.v1.ContextShiftService.ShiftContext`), as
    the reflection protocol allows and clients such as ghz ask; the pool itself knows only
    messages, enums, services and fields by name."""

    def __init__(self) -> None:
        self._pool = descriptor_pool.Default()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            service = self._pool.FindServiceByName(service_name)  # KeyError: NOT_FOUND
            if method not in service.methods_by_name:
                raise
            return service.file
