"""`contextshift serve`: the grpc.aio server and, in the same event loop, the HTTP/JSON surface
(uvicorn), their worker processes and their graceful stop.

One process: SO_REUSEPORT is off, so a port already in use fails loudly. N processes: the parent
reserves both ports with SO_REUSEPORT, forks N children (no gRPC object exists before the fork),
and each child serves on the same ports; the kernel spreads connections across them. With
`worker_port_base` / `worker_http_port_base` each worker also (or, without `shared_ports`, only)
serves on its own ports, for a balancer that keeps each chat on one worker, and `workers_file`
says which worker is where (`listeners`). The parent
reads the API keys and TLS files first, so a bad one stops the start with a usage error, and owns
the directory where the workers' metrics meet (`metrics.use_directory`).

On SIGTERM (or SIGINT) a child sets health to NOT_SERVING (and /readyz to 503) so balancers stop
sending, waits `drain_seconds`, then stops accepting calls and gives in-flight ones `grace_seconds`
to finish.

The store is checked before anything serves: the parent opens it, applies its migrations, loads
the model configuration file and closes it again (a bad URL, an unreachable PostgreSQL or a bad
file is one error line and a non-zero exit). Each serving process then opens its own connections,
and keeps house in the background: generations past their retention are pruned hourly, and with
`chat_retention_days`, idle chats are deleted (a tenth of the retention apart, at most an hour).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import uvicorn
from google.protobuf import descriptor_pool
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from contextshift.api import listeners, metrics, tls
from contextshift.api.auth import ApiKeys, load_keys
from contextshift.api.config import ConfigError, ServerConfig
from contextshift.api.gateway import upstreams
from contextshift.api.gateway.routes import Gateway
from contextshift.api.grpc.echo import ECHO_SERVICE, add_echo_service
from contextshift.api.grpc.interceptor import GateInterceptor
from contextshift.api.grpc.services import CONTEXT_SERVICE, MethodResolvingPool, add_context_service
from contextshift.api.http import serving
from contextshift.api.http.app import HttpApi
from contextshift.api.listeners import BindError, Running, Worker
from contextshift.api.logs import setup_logging
from contextshift.api.readiness import StoreReadiness
from contextshift.api.service import model_configs
from contextshift.api.service.gate import Gate
from contextshift.api.service.servicer import ContextShiftService
from contextshift.audit import bounds, open_store
from contextshift.audit.store import Store, StoreConfigError, StoreError, now_ms, redacted
from contextshift.audit.writer import GroupWriter
from contextshift.budget import Budget
from contextshift.options import Secret
from contextshift.summarizer import llm

log = logging.getLogger("contextshift.api")

PRUNE_INTERVAL_SECONDS = 3600.0
# The bound of the housekeeping's store calls (a day's generations pruned at once may take longer
# than a call's bound).
HOUSEKEEPING_BOUND_SECONDS = 60.0
RETENTION_BATCH = 500  # idle chats listed at a time


@dataclass(frozen=True)
class Security:
    """The API keys and TLS material every worker serves with, read once before the workers start."""

    keys: ApiKeys | None
    tls: tls.Tls | None

    @classmethod
    def load(cls, config: ServerConfig) -> Security:
        """Raises ConfigError for a file that cannot be read or a malformed key or certificate."""
        return cls(load_keys(config.api_keys_file, config.api_keys), tls.load(config))


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
            prune = functools.partial(
                bounds.with_bound, HOUSEKEEPING_BOUND_SECONDS, prune_generations, store, config
            )
            await loop.run_in_executor(executor, prune)
        except StoreError as e:
            log.warning("pruning generations failed", extra={"fields": {"error": str(e)}})


async def delete_idle_chats(store: Store, executor: ThreadPoolExecutor, retention_days: float) -> int:
    """Deletes every chat neither shifted nor appended to for `retention_days`, each as DeleteChat
    does (and only if still idle when its deletion runs), one store call at a time on the engine
    threads; returns how many."""
    loop = asyncio.get_running_loop()
    cutoff = now_ms() - round(retention_days * 86_400_000)
    deleted = 0
    bound = HOUSEKEEPING_BOUND_SECONDS
    while True:
        idle = functools.partial(bounds.with_bound, bound, store.idle_chats, cutoff, RETENTION_BATCH)
        chats = await loop.run_in_executor(executor, idle)
        gone = 0
        for tenant, chat_id in chats:
            delete = functools.partial(
                bounds.with_bound, bound, store.delete_chat, tenant, chat_id, idle_before_ms=cutoff
            )
            gone += await loop.run_in_executor(executor, delete)
        deleted += gone
        if len(chats) < RETENTION_BATCH or not gone:
            return deleted


async def _expire_chats(store: Store, executor: ThreadPoolExecutor, retention_days: float) -> None:
    interval = min(PRUNE_INTERVAL_SECONDS, retention_days * 86_400 / 10)
    while True:
        try:
            deleted = await delete_idle_chats(store, executor, retention_days)
        except StoreError as e:
            log.warning("deleting idle chats failed", extra={"fields": {"error": str(e)}})
        else:
            if deleted:
                metrics.record_deleted_chats("retention", deleted)
                fields = {"chats": deleted, "chat_retention_days": retention_days}
                log.info("deleted idle chats", extra={"fields": fields})
        await asyncio.sleep(interval)


@dataclass
class Server:
    """A started server and what its stop needs."""

    server: aio.Server
    health: health.aio.HealthServicer
    executor: ThreadPoolExecutor
    port: int  # the shared gRPC port, else the worker's own (as http_port)
    http_api: HttpApi
    http: uvicorn.Server
    http_task: asyncio.Task[None]
    http_port: int
    store: Store
    writer: GroupWriter
    housekeeping: list[asyncio.Task[None]]  # pruning generations, deleting idle chats
    io_executor: ThreadPoolExecutor | None = None
    compaction: llm.LoopTransport | None = None
    gateway: Gateway | None = None

    async def stop(self, config: ServerConfig) -> None:
        """Health NOT_SERVING, the drain delay, then in-flight calls get the grace period; the
        store closes once the threads using it are done."""
        log.info("draining", extra={"fields": {"drain_seconds": config.drain_seconds}})
        self.http_api.ready = False
        await self.health.enter_graceful_shutdown()
        await asyncio.sleep(config.drain_seconds)
        self.http.should_exit = True  # uvicorn then waits up to grace_seconds for calls in flight
        await asyncio.gather(self.server.stop(config.grace_seconds), self.http_task)
        if self.gateway is not None:
            await self.gateway.aclose()
        for task in self.housekeeping:
            task.cancel()
        shutdown = functools.partial(self.executor.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, shutdown)
        await asyncio.get_running_loop().run_in_executor(None, self.writer.close)
        self.store.close()
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


def _http_sockets(config: ServerConfig, http_port: int | None, worker: Worker) -> list[socket.socket]:
    """The HTTP listening sockets of a worker: the shared port's (unless off), its own port's."""
    wanted = (
        [("http_port", config.http_port if http_port is None else http_port)] if config.shared_ports else []
    )
    if worker.http_port is not None:
        wanted.append((worker.setting("http_port"), worker.http_port))
    socks: list[socket.socket] = []
    try:
        for setting, port in wanted:
            socks.append(listeners.listen(setting, config.host, port, config.workers > 1))
    except BindError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _add_ports(
    server: aio.Server, config: ServerConfig, port: int, worker: Worker, credentials: tls.Tls | None
) -> list[int]:
    """Binds the gRPC ports of a worker (the shared one unless off, its own): the ports bound."""
    wanted = [("port", port)] if config.shared_ports else []
    if worker.port is not None:
        wanted.append((worker.setting("port"), worker.port))
    bound = []
    for setting, number in wanted:
        address = f"{config.host}:{number}"
        try:
            if credentials is None:
                bound.append(server.add_insecure_port(address))
            else:
                bound.append(server.add_secure_port(address, credentials.grpc_credentials()))
        except RuntimeError:  # grpc says only "Failed to bind to address"
            raise BindError(
                setting, config.host, number, "in use, or not an address of this machine"
            ) from None
    return bound


async def start(
    config: ServerConfig,
    port: int,
    http_port: int | None = None,
    security: Security | None = None,
    worker: Worker | None = None,
) -> Server:
    """Build, bind and start a server; it serves until `Server.stop`. `http_port` defaults to the
    config's, `security` to what the config's files say, `worker` (its index and own ports) to the
    first. StoreError when the store cannot be opened."""
    security = security or Security.load(config)
    worker = worker or Worker.of(config, 0)
    # Bound first: a taken HTTP port fails before anything else runs.
    http_socks = _http_sockets(config, http_port, worker)
    server = aio.server(
        interceptors=[GateInterceptor(Gate(security.keys))],  # gRPC bounds its calls in flight itself
        options=[
            ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
            ("grpc.max_receive_message_length", config.max_request_bytes),
        ],
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    # Their tasks see the submitting call's context: its deadline bounds its store calls.
    executor = bounds.ContextExecutor(config.engine_threads, thread_name_prefix="contextshift-engine")
    io_executor = bounds.ContextExecutor(config.io_threads, thread_name_prefix="contextshift-io")
    store = metrics.timed_store(
        open_store(
            config.store,
            pool_size=config.engine_threads,
            max_bytes=config.max_store_bytes,
            reserve_bytes=config.store_reserve_bytes,
            timeout_ms=config.store_timeout_ms,
        )
    )
    metrics.watch_store(store, max_bytes=config.max_store_bytes)
    # A no-op when current; unbounded otherwise (a migration may rewrite tables).
    await asyncio.get_running_loop().run_in_executor(executor, bounds.with_bound, None, store.migrate)
    writer = GroupWriter(store)
    defaults = Budget(config.context_size, config.max_output_tokens)
    service = ContextShiftService(
        executor,
        defaults,
        store,
        inline_request_bytes=config.inline_request_bytes,
        audit_messages=config.audit_messages,
        io_executor=io_executor,
        store_cache_seconds=config.store_cache_seconds,
        writer=writer,
    )
    add_context_service(service, server)
    compaction = _configure_compaction(config)
    services = [CONTEXT_SERVICE.full_name]
    if config.bench_echo:
        add_echo_service(server)
        services.append(ECHO_SERVICE.full_name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*services, health.SERVICE_NAME, reflection.SERVICE_NAME],
        server,
        pool=cast(descriptor_pool.DescriptorPool, MethodResolvingPool()),  # the methods it calls
    )

    http_gate = Gate(security.keys, config.max_concurrent_rpcs)
    gateway = Gateway(service, http_gate, config)
    api = HttpApi(service, http_gate, max_request_bytes=config.max_request_bytes, routes=gateway.routes())
    app = api.app()

    try:
        bound = _add_ports(server, config, port, worker, security.tls)
    except BindError:
        for sock in http_socks:
            sock.close()
        raise
    await server.start()
    try:
        http, http_task = await serving.start(app, config, http_socks, security.tls)
    except BaseException:
        await server.stop(None)
        raise
    for name in ["", *services]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    http_bound = [sock.getsockname()[1] for sock in http_socks]
    shared = {"port": bound[0], "http_port": http_bound[0]} if config.shared_ports else {}
    own = {"worker_port": worker.port, "worker_http_port": worker.http_port}
    log.info(
        "serving",
        extra={
            "fields": {
                "host": config.host,
                **shared,
                "worker": worker.index,
                **{name: own_port for name, own_port in own.items() if own_port is not None},
                "tls": "mutual" if security.tls and security.tls.client_ca else bool(security.tls),
                "api_keys": len(security.keys or ()),
                "metrics_dir": metrics.directory(),
                "store": store.description,
            }
        },
    )
    housekeeping = [asyncio.create_task(_prune_hourly(store, executor, config))]

    async def store_readiness(problem: str | None) -> None:
        api.store_problem = problem
        ready = problem is None
        status = (
            health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *services]:
            await health_servicer.set(name, status)  # ignored once a drain began

    readiness = StoreReadiness(store, config.store_timeout_ms / 1e3, store_readiness)
    housekeeping.append(asyncio.create_task(readiness.run()))
    if config.chat_retention_days is not None:
        housekeeping.append(asyncio.create_task(_expire_chats(store, executor, config.chat_retention_days)))
    return Server(
        server,
        health_servicer,
        executor,
        bound[0],
        api,
        http,
        http_task,
        http_bound[0],
        store,
        writer,
        housekeeping,
        io_executor,
        compaction,
        gateway,
    )


async def serve(
    config: ServerConfig,
    port: int,
    http_port: int | None,
    security: Security,
    worker: Worker,
    started: Callable[[Server], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain and stop; `started` is called once it serves."""
    running = await start(config, port, http_port, security, worker)
    if started is not None:
        started(running)
    # What start-up made lives as long as the process: out of the collector's full collections,
    # which otherwise walk it all, a pause that grows with the process's start-up objects.
    gc.freeze()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await running.stop(config)


def _serve_process(config: ServerConfig, serving: Coroutine[Any, Any, None]) -> int:
    """Runs `serving` (a `serve`) to its end: the process's exit code."""
    try:
        asyncio.run(serving)
    except BindError as e:
        log.error("cannot serve", extra={"fields": e.fields})
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


def _run_workers(config: ServerConfig, security: Security) -> int:
    with contextlib.ExitStack() as held:
        port = http_port = None
        if config.shared_ports:
            port = held.enter_context(listeners.reserved_port("port", config.host, config.port))
            http_port = held.enter_context(
                listeners.reserved_port("http_port", config.host, config.http_port)
            )
        held.enter_context(listeners.reserved_workers(config))
        running: dict[int, Running] = {}
        # The parent's objects, frozen, are never written by the workers' collections: their
        # pages stay shared.
        gc.freeze()
        for index in range(config.workers):
            worker = Worker.of(config, index)
            pid = os.fork()
            if pid == 0:
                metrics.set_worker(index)
                code = _serve_process(config, serve(config, port or 0, http_port, security, worker))
                logging.shutdown()
                os._exit(code)
            running[pid] = Running(index, pid, worker.port, worker.http_port)
        children = list(running)

        def forward(signum: int, _frame: object) -> None:
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        workers = [asdict(w) for w in running.values()]
        fields = {"port": port, "http_port": http_port, "workers": workers}
        log.info("workers started", extra={"fields": fields})
        _write_workers_file(config, port, http_port, running.values())
        failed = False
        while children:
            pid, status = os.wait()
            children.remove(pid)
            gone = running.pop(pid)
            _write_workers_file(config, port, http_port, running.values())
            metrics.worker_exited(pid)
            code = os.waitstatus_to_exitcode(status)
            log.info("worker exited", extra={"fields": {"worker": gone.index, "pid": pid, "code": code}})
            if code != 0 and not failed:
                # A worker died: stop the rest so a supervisor sees the failure and restarts us.
                failed = True
                log.error("worker failed", extra={"fields": {"worker": pid, "status": status}})
                forward(signal.SIGTERM, None)
        return 1 if failed else 0


def _write_workers_file(
    config: ServerConfig, port: int | None, http_port: int | None, workers: Iterable[Running]
) -> None:
    if config.workers_file is not None:
        listeners.write_workers_file(config.workers_file, config, port, http_port, list(workers))


@contextlib.contextmanager
def _workers_file(config: ServerConfig) -> Iterator[None]:
    """Removes the workers file when the server stops."""
    try:
        yield
    finally:
        if config.workers_file is not None:
            Path(config.workers_file).unlink(missing_ok=True)


@contextlib.contextmanager
def _metrics_directory() -> Iterator[None]:
    """A fresh directory of this server's own for the workers' metrics, removed at the end."""
    path = tempfile.mkdtemp(prefix="contextshift-metrics-")
    metrics.use_directory(path)
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(config: ServerConfig) -> int:
    """Serve with `config`; the process exit code. Raises ConfigError for unreadable or malformed
    key and TLS files."""
    setup_logging(config.log_level)
    code = prepare_store(config)
    if code:
        return code
    security = Security.load(config)
    try:
        upstreams.with_keys(config.upstreams)  # a key's variable unset stops the start here
    except upstreams.UpstreamConfigError as e:
        raise ConfigError(str(e)) from None
    with _metrics_directory(), _workers_file(config):
        if config.workers > 1:
            try:
                return _run_workers(config, security)
            except BindError as e:
                log.error("cannot serve", extra={"fields": e.fields})
                return 1
        worker = Worker.of(config, 0)

        def started(server: Server) -> None:  # the ports bound (a port of 0 is one now)
            port, http_port = (server.port, server.http_port) if config.shared_ports else (None, None)
            entry = Running(0, os.getpid(), worker.port, worker.http_port)
            _write_workers_file(config, port, http_port, [entry])

        return _serve_process(config, serve(config, config.port, config.http_port, security, worker, started))
