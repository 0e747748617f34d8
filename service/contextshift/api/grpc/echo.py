"""Benchmark only (served with --bench-echo): the cost of a unary call with no work, for
benchmarks/grpc_bench.py's floors."""

from __future__ import annotations

from grpc import aio

from contextshift._proto.contextshift.bench.v1 import echo_service_pb2
from contextshift.api.grpc.services import add_service

ECHO_SERVICE = echo_service_pb2.DESCRIPTOR.services_by_name["EchoService"]


class EchoService:
    """Echo parses the request and returns its payload, as a servicer on the generated code does;
    EchoBytes returns the request's bytes unparsed, the floor of gRPC itself."""

    async def Echo(self, request: echo_service_pb2.EchoRequest) -> echo_service_pb2.EchoResponse:
        return echo_service_pb2.EchoResponse(payload=request.payload)

    async def EchoBytes(self, request: bytes) -> bytes:
        return request  # an EchoBytesResponse is encoded as the EchoBytesRequest it answers


def add_echo_service(server: aio.Server) -> None:
    add_service(server, EchoService(), ECHO_SERVICE, encoded={"EchoBytes"})
