"""`contextshift serve`: the grpc.aio server, its worker processes and its graceful stop.

One process: SO_REUSEPORT is off, so a port already in use fails loudly. N processes: the parent
reserves the port with SO_REUSEPORT, forks N children (no gRPC object exists before the fork), and
each child serves on the same port; the kernel spreads connections across them.

On SIGTERM (or SIGINT) a child sets health to NOT_SERVING so balancers stop sending, waits
`drain_seconds`, then stops accepting calls and gives in-flight ones `grace_seconds` to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from contextshift._proto.contextshift.bench.v1 import echo_service_pb2
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api.config import ServerConfig
from contextshift.api.convert import BudgetDefaults
from contextshift.api.interceptors import ErrorsAndLogging, JsonFormatter
from contextshift.api.servicer import ContextShiftServicer, add_context_service, add_echo_service
from contextshift.options import Secret
from contextshift.summarizer import llm

log = logging.getLogger("contextshift.api")

SERVICE = context_service_pb2.DESCRIPTOR.services_by_name["ContextShiftService"].full_name
ECHO_SERVICE = echo_service_pb2.DESCRIPTOR.services_by_name["EchoService"].full_name


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("contextshift")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


@dataclass
class Server:
    """A started server and what its stop needs."""

    server: aio.Server
    health: health.aio.HealthServicer
    executor: ThreadPoolExecutor
    port: int
    io_executor: ThreadPoolExecutor | None = None
    compaction: llm.LoopTransport | None = None

    async def stop(self, config: ServerConfig) -> None:
        """Health NOT_SERVING, the drain delay, then in-flight calls get the grace period."""
        log.info("draining", extra={"fields": {"drain_seconds": config.drain_seconds}})
        await self.health.enter_graceful_shutdown()
        await asyncio.sleep(config.drain_seconds)
        await self.server.stop(config.grace_seconds)
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.io_executor is not None:
            self.io_executor.shutdown(wait=False, cancel_futures=True)
        if self.compaction is not None:
            llm.configure(None)
            await self.compaction.aclose()
        log.info("stopped")


def _configure_compaction(config: ServerConfig) -> llm.LoopTransport | None:
    """llm-compact's endpoint from the settings, reached from this (running) event loop."""
    if config.compact_url is None or config.compact_model is None:
        return None
    models = {"main": config.compact_model}
    if config.compact_fast_model:
        models["fast"] = config.compact_fast_model
    transport = llm.LoopTransport.on_running_loop()
    key = Secret(config.compact_api_key or "")
    llm.configure(
        llm.ConfiguredEndpoint(config.compact_url, models, key, config.compact_timeout_ms, transport)
    )
    fields = {
        "url": llm.shown_url(config.compact_url),
        "models": models,
        "timeout_ms": config.compact_timeout_ms,
    }
    log.info("llm compaction configured", extra={"fields": fields})
    return transport


async def start(config: ServerConfig, port: int) -> Server:
    """Build, bind and start a server; it serves until `Server.stop`."""
    server = aio.server(
        interceptors=[ErrorsAndLogging()],
        options=[
            ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
            ("grpc.max_receive_message_length", config.max_request_bytes),
        ],
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    executor = ThreadPoolExecutor(config.engine_threads, thread_name_prefix="contextshift-engine")
    io_executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="contextshift-io")
    defaults = BudgetDefaults(config.context_size, config.max_output_tokens)
    servicer = ContextShiftServicer(
        executor, defaults, inline_request_bytes=config.inline_request_bytes, io_executor=io_executor
    )
    add_context_service(servicer, server)
    compaction = _configure_compaction(config)
    services = [SERVICE]
    if config.bench_echo:
        add_echo_service(server)
        services.append(ECHO_SERVICE)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    bound = server.add_insecure_port(f"{config.host}:{port}")
    await server.start()
    for name in ["", *services]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving", extra={"fields": {"host": config.host, "port": bound}})
    return Server(server, health_servicer, executor, bound, io_executor, compaction)


async def serve(config: ServerConfig, port: int) -> None:
    """Serve until SIGTERM/SIGINT, then drain and stop."""
    running = await start(config, port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await running.stop(config)


def _serve_process(config: ServerConfig, port: int) -> int:
    try:
        asyncio.run(serve(config, port))
    except RuntimeError as e:  # grpc's "Failed to bind": the port is taken or the host is wrong
        log.error("cannot serve", extra={"fields": {"host": config.host, "port": port, "error": str(e)}})
        return 1
    return 0


@contextlib.contextmanager
def _reserved_port(host: str, port: int) -> Iterator[int]:
    """Hold host:port with SO_REUSEPORT while the workers run, so a port of 0 picks one port for
    all of them and another program without SO_REUSEPORT cannot take it meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        yield sock.getsockname()[1]


def _run_workers(config: ServerConfig) -> int:
    with _reserved_port(config.host, config.port) as port:
        children: list[int] = []
        for _ in range(config.workers):
            pid = os.fork()
            if pid == 0:
                code = _serve_process(config, port)
                logging.shutdown()
                os._exit(code)
            children.append(pid)

        def forward(signum: int, _frame: object) -> None:
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        log.info("workers started", extra={"fields": {"port": port, "workers": children}})
        failed = False
        while children:
            pid, status = os.wait()
            children.remove(pid)
            if os.waitstatus_to_exitcode(status) != 0 and not failed:
                # A worker died: stop the rest so a supervisor sees the failure and restarts us.
                failed = True
                log.error("worker failed", extra={"fields": {"worker": pid, "status": status}})
                forward(signal.SIGTERM, None)
        return 1 if failed else 0


def run(config: ServerConfig) -> int:
    """Serve with `config`; the process exit code."""
    setup_logging(config.log_level)
    if config.workers > 1:
        return _run_workers(config)
    return _serve_process(config, config.port)
