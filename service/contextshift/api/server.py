"""`contextshift serve`: the grpc.aio server, its worker processes and its graceful stop.

One process: SO_REUSEPORT is off, so a port already in use fails loudly. N processes: the parent
reserves the port with SO_REUSEPORT, forks N children (no gRPC object exists before the fork), and
each child serves on the same port; the kernel spreads connections across them.

On SIGTERM (or SIGINT) a child sets health to NOT_SERVING so balancers stop sending, waits
`drain_seconds`, then stops accepting calls and gives in-flight ones `grace_seconds` to finish.

The store is checked before anything serves: the parent opens it, applies its migrations, loads
the model configuration file and closes it again (a bad URL, an unreachable PostgreSQL or a bad
file is one error line and a non-zero exit). Each serving process then opens its own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from contextshift._proto.contextshift.bench.v1 import echo_service_pb2
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api import model_configs
from contextshift.api.config import ServerConfig
from contextshift.api.convert import BudgetDefaults
from contextshift.api.interceptors import ErrorsAndLogging, JsonFormatter
from contextshift.api.servicer import ContextShiftServicer, add_context_service, add_echo_service
from contextshift.audit import open_store, redacted
from contextshift.audit.store import Store, StoreConfigError, StoreError, now_ms

log = logging.getLogger("contextshift.api")

PRUNE_INTERVAL_SECONDS = 3600.0

SERVICE = context_service_pb2.DESCRIPTOR.services_by_name["ContextShiftService"].full_name
ECHO_SERVICE = echo_service_pb2.DESCRIPTOR.services_by_name["EchoService"].full_name


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("contextshift")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def prune_generations(store: Store, config: ServerConfig) -> None:
    """Forgets generations past their retention (not a chat's current one)."""
    pruned = store.prune_generations(now_ms() - config.generation_retention_hours * 3_600_000)
    if pruned:
        log.info("pruned generations", extra={"fields": {"generations": pruned}})


async def _prune_hourly(store: Store, executor: ThreadPoolExecutor, config: ServerConfig) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(PRUNE_INTERVAL_SECONDS)
        try:
            await loop.run_in_executor(executor, prune_generations, store, config)
        except StoreError as e:
            log.warning("pruning generations failed", extra={"fields": {"error": str(e)}})


@dataclass
class Server:
    """A started server and what its stop needs."""

    server: aio.Server
    health: health.aio.HealthServicer
    executor: ThreadPoolExecutor
    port: int
    store: Store
    pruner: asyncio.Task[None]

    async def stop(self, config: ServerConfig) -> None:
        """Health NOT_SERVING, the drain delay, then in-flight calls get the grace period; the
        store closes once the threads using it are done."""
        log.info("draining", extra={"fields": {"drain_seconds": config.drain_seconds}})
        await self.health.enter_graceful_shutdown()
        await asyncio.sleep(config.drain_seconds)
        await self.server.stop(config.grace_seconds)
        self.pruner.cancel()
        shutdown = functools.partial(self.executor.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, shutdown)
        self.store.close()
        log.info("stopped")


async def start(config: ServerConfig, port: int) -> Server:
    """Build, bind and start a server; it serves until `Server.stop`. StoreError when the store
    cannot be opened."""
    server = aio.server(
        interceptors=[ErrorsAndLogging()],
        options=[
            ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
            ("grpc.max_receive_message_length", config.max_request_bytes),
        ],
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    executor = ThreadPoolExecutor(config.engine_threads, thread_name_prefix="contextshift-engine")
    store = open_store(config.store, pool_size=config.engine_threads)
    await asyncio.get_running_loop().run_in_executor(executor, store.migrate)  # no-op when current
    defaults = BudgetDefaults(config.context_size, config.max_output_tokens)
    servicer = ContextShiftServicer(
        executor,
        defaults,
        store,
        inline_request_bytes=config.inline_request_bytes,
        audit_messages=config.audit_messages,
    )
    add_context_service(servicer, server)
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
    log.info("serving", extra={"fields": {"host": config.host, "port": bound, "store": store.description}})
    pruner = asyncio.create_task(_prune_hourly(store, executor, config))
    return Server(server, health_servicer, executor, bound, store, pruner)


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
    except StoreError as e:
        log.error(
            "cannot open the store", extra={"fields": {"store": redacted(config.store), "error": str(e)}}
        )
        return 1
    return 0


def prepare_store(config: ServerConfig) -> int:
    """Opens the store, applies its migrations, loads the model configuration file into it and
    prunes old generations, then closes it (before any fork): 0, or the exit code of the error it
    logged (2 for a bad URL or file, 1 for a store that cannot be reached)."""
    try:
        store = open_store(config.store, pool_size=1)
    except StoreConfigError as e:
        log.error(
            "cannot open the store", extra={"fields": {"store": redacted(config.store), "error": str(e)}}
        )
        return 2
    try:
        version = store.migrate()
        loaded = []
        if config.model_config_file:
            for model_config in model_configs.load_file(Path(config.model_config_file)):
                store.set_model_config(model_configs.SERVER_WIDE_TENANT, model_config)
                loaded.append(model_config.model)
        prune_generations(store, config)
    except (StoreConfigError, model_configs.ModelConfigFileError) as e:
        log.error("cannot open the store", extra={"fields": {"store": store.description, "error": str(e)}})
        return 2
    except StoreError as e:
        log.error("cannot open the store", extra={"fields": {"store": store.description, "error": str(e)}})
        return 1
    finally:
        store.close()
    log.info(
        "store ready", extra={"fields": {"store": store.description, "schema": version, "models": loaded}}
    )
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
    code = prepare_store(config)
    if code:
        return code
    if config.workers > 1:
        return _run_workers(config)
    return _serve_process(config, config.port)
