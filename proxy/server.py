"""The kipside server: listeners, upstream discovery, sessions and graceful shutdown.

At start kipside asks the upstream bootstrap brokers for their nodes (a Metadata request), opens
the bootstrap listener and one listener per node at a deterministic port, prints them, and then
serves. Nodes learned later from responses get their listener at once, before the response that
names them reaches the client. On SIGTERM/SIGINT it stops accepting, lets each session finish the
requests it already forwarded, and closes what is left at the shutdown deadline.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import trio

from kipside.protocol import (
    Address,
    ApiKey,
    NotKafkaError,
)
from kipside.proxy.core.decisions import Pipeline
from kipside.proxy.core.identity import Principal
from kipside.proxy.core.limits import ServerLimits
from kipside.proxy.operations.admin import AdminApp, serve_admin
from kipside.proxy.operations.cert_reload import CertificateReloader
from kipside.proxy.operations.reload import RuleReloader
from kipside.proxy.security import (
    ClientSasl,
)
from kipside.proxy.security.certificates import (
    ListenerTlsFiles,
    UpstreamTlsFiles,
)
from kipside.proxy.security.settings import Security, SecurityError
from kipside.proxy.session.answers import AnswerWriter
from kipside.proxy.session.own_connection import OwnConnection
from kipside.proxy.session.session import Session
from kipside.proxy.stages.coalescing import Coalescer
from kipside.proxy.stages.context import FeatureContext
from kipside.proxy.stages.pipeline import Stages
from kipside.proxy.stages.principals import FETCH_BY_NAME_MAX_VERSION
from kipside.proxy.stages.versions import VersionPolicy
from kipside.proxy.telemetry.metric_readers import otlp_metrics_endpoint
from kipside.proxy.telemetry.metrics import Metrics
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import TraceConfig, Tracer
from kipside.proxy.upstream.addresses import AddressRewriter
from kipside.proxy.upstream.connection import DEFAULT_ANSWER_TIMEOUT_SECONDS
from kipside.proxy.upstream.discovery import discover_nodes
from kipside.proxy.upstream.lanes import LanePool
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import RuleSet, default_rules

log = logging.getLogger("kipside.server")

DEFAULT_DISCOVERY_TIMEOUT_SECONDS = 30.0


@dataclass(slots=True)
class ServerConfig:
    upstreams: Sequence[Address]
    listen: Address
    advertise_host: str | None = None
    node_port_base: int | None = None
    rules: RuleSet = field(default_factory=default_rules)
    shutdown_grace_seconds: float = 5.0
    admin: Address | None = None
    share_connections: bool = True
    """Lanes and coalescing; False gives every client its own upstream connection (1:1)."""
    discovery_timeout_seconds: float = DEFAULT_DISCOVERY_TIMEOUT_SECONDS
    upstream_request_timeout_seconds: float = DEFAULT_ANSWER_TIMEOUT_SECONDS
    """A shared lane whose oldest request goes unanswered this long is closed (its clients
    resend), as a client closes a connection after request.timeout.ms."""
    trace: TraceConfig = field(default_factory=lambda: TraceConfig("none"))
    tls: ListenerTlsFiles | None = None
    """TLS on every client listener (--tls-cert, --tls-key, --tls-client-ca)."""
    upstream_tls: UpstreamTlsFiles | None = None
    """TLS toward every broker (--upstream-ca, ...); None: plaintext."""
    sasl_credentials: str | None = None
    """kipside authenticates clients with SASL against this file (--sasl-credentials);
    None: clients' SASL passes through to the brokers."""
    sasl_upstream: str | None = None
    """Per principal, kipside's SASL login to the brokers (--sasl-upstream)."""


class StartupError(RuntimeError):
    """kipside could not start; the message says what to change."""


def _bind(host: str, port: int) -> trio.SocketListener:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(socket.SOMAXCONN)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


class Server:
    def __init__(self, config: ServerConfig, *, tracer: Tracer | None = None) -> None:
        self.config = config
        self.rules = config.rules
        self.nodes = NodeMap(
            advertise_host=config.advertise_host or config.listen.host,
            node_port_base=config.node_port_base,
            on_new_node=self._on_new_node,
            on_node_changed=self._on_node_changed,
        )
        self.rewriter = AddressRewriter(self.nodes)
        self.versions = VersionPolicy(
            lower_transaction_version=bool(config.rules.transactions) and config.share_connections,
            max_fetch_version=FETCH_BY_NAME_MAX_VERSION
            if any(rule.topics is not None for rule in config.rules.principals)
            else None,
        )
        self.stats = Stats()
        self.tracer = tracer or Tracer(config.trace, config.rules.tracing)
        self.writer = AnswerWriter(
            self.versions, self.rewriter, self.stats, self.tracer if self.tracer.active else None
        )
        self._shutdown_requested = trio.Event()
        self.limits = ServerLimits(lambda: self.rules.limits, self.stats)
        self.stages: Stages | None = None
        self._pipeline: tuple[RuleSet, Pipeline] | None = None
        self.sessions: set[Session] = set()
        self._pools: dict[tuple[int, Principal], LanePool] = {}
        self._service_nursery: trio.Nursery | None = None
        self.bootstrap_address: Address | None = None
        self._listener_nursery: trio.Nursery | None = None
        self._session_nursery: trio.Nursery | None = None
        self._node_listeners: dict[int, trio.SocketListener] = {}
        self._rotation = 0
        self._session_ended = trio.Event()
        self.security: Security | None = None  # loaded by serve()
        self.ready = trio.Event()
        self.reloader = RuleReloader(self)
        self.reloader.on_applied.append(self.limits.rules_changed)
        self.metrics = Metrics(
            self.stats,
            rules=lambda: self.rules,
            reloads=self.reloader,
            otlp_endpoint=otlp_metrics_endpoint(config.trace.otlp_endpoint),
        )

    # Listeners -------------------------------------------------------------------------

    def _on_new_node(self, node_id: int) -> None:
        if node_id in self._node_listeners or self._listener_nursery is None:
            return
        port = self.nodes.wanted_port(node_id)
        try:
            listener = _bind(self.config.listen.host, port)
        except StartupError as exc:
            # The response naming this node still carries the deterministic port; clients
            # that dial it get refused and retry through the bootstrap listener.
            log.error("node %d: %s", node_id, exc)
            return
        self._start_node_listener(node_id, listener)

    def _on_node_changed(self, node_id: int, why: str) -> None:
        """A node left the cluster or moved: end the client connections that came in on its
        listener and the shared connections to it (redialled on next use), so that nothing
        stays connected to where it was. Its listener stays: its address never changes."""
        reason = f"upstream node {node_id} {why}"
        for session in list(self.sessions):
            if session.node_id == node_id:
                session.disconnect(reason)
        for (pool_node, _principal), pool in self._pools.items():
            if pool_node == node_id and self._service_nursery is not None:
                self._service_nursery.start_soon(pool.aclose)

    def _start_node_listener(self, node_id: int, listener: trio.SocketListener) -> None:
        assert self._listener_nursery is not None
        bound = listener.socket.getsockname()[1]
        self._node_listeners[node_id] = listener
        self.nodes.bound(node_id, bound)
        upstream = self.nodes.upstream(node_id)
        print(
            f"kipside: node {node_id} listening on {self.config.listen.host}:{bound} "
            f"-> upstream {upstream}",
            flush=True,
        )

        async def for_node(stream: trio.SocketStream) -> None:
            target = self.nodes.upstream(node_id)
            if target is None:  # cannot happen: the listener exists because the node is known
                await trio.aclose_forcefully(stream)
                return
            if self.nodes.is_gone(node_id):
                log.info(
                    "client %s dialled the listener of node %d, which has left the cluster; "
                    "closing so the client refreshes its metadata",
                    Address(*stream.socket.getpeername()[:2]),
                    node_id,
                )
                await trio.aclose_forcefully(stream)
                return
            await self._run_session(stream, [target], node_id)

        self._listener_nursery.start_soon(self._serve_listener, listener, for_node)

    async def _serve_listener(
        self,
        listener: trio.SocketListener,
        handler: Callable[[trio.SocketStream], Awaitable[None]],
    ) -> None:
        assert self._session_nursery is not None
        await trio.serve_listeners(handler, [listener], handler_nursery=self._session_nursery)

    async def _bootstrap_session(self, stream: trio.SocketStream) -> None:
        upstreams = list(self.config.upstreams)
        self._rotation = (self._rotation + 1) % len(upstreams)
        await self._run_session(
            stream, upstreams[self._rotation :] + upstreams[: self._rotation], None
        )

    async def _run_session(
        self, stream: trio.SocketStream, targets: list[Address], node_id: int | None
    ) -> None:
        if not self.limits.admit(stream.socket.getpeername):
            await trio.aclose_forcefully(stream)
            return
        # Counted from here: a connection in its TLS handshake holds a socket too.
        self.stats.client_connections += 1
        try:
            await self._serve_client(stream, targets, node_id)
        finally:
            self.stats.client_connections -= 1
            self._session_ended.set()

    async def _serve_client(
        self, stream: trio.SocketStream, targets: list[Address], node_id: int | None
    ) -> None:
        security = self._security()
        accepted = await security.accept(stream)
        if accepted is None:
            return
        wire, principal = accepted
        max_frame_bytes = self.rules.limits.max_frame_bytes
        own = OwnConnection(
            targets,
            max_frame_bytes=max_frame_bytes,
            stats=self.stats,
            dial=security.dial,
            answer_timeout=self.config.upstream_request_timeout_seconds,
        )
        session = Session(
            wire,
            pipeline=self.pipeline,
            own=own,
            writer=self.writer,
            limits=self.limits,
            max_frame_bytes=max_frame_bytes,
            node_id=node_id,
            principal=principal,
            sasl=ClientSasl(security.sasl_termination()),
        )
        self.sessions.add(session)
        try:
            await session.run()
        except Exception:
            # A kipside bug met by one client's traffic ends that client's connection only;
            # let it escape and trio would end every session and the server with it.
            log.exception(
                "%s: unexpected error in kipside; closing this connection only. Please report "
                "this line and the traceback",
                session.describe(),
            )
        finally:
            self.sessions.discard(session)

    # Shared upstream connections -------------------------------------------------------

    def pipeline(self) -> Pipeline:
        """The request pipeline under the rules in force (built again after a reload)."""
        built = self._pipeline
        rules = self.rules
        if built is None or built[0] is not rules:
            assert self.stages is not None, "serve() builds the stages before any session"
            built = self._pipeline = (rules, self.stages.pipeline(rules))
        return built[1]

    @property
    def coalescer(self) -> Coalescer | None:
        return None if self.stages is None else self.stages.coalescer

    def pool(self, node_id: int, principal: Principal) -> LanePool:
        """The lanes to `node_id` for `principal` (made on first use)."""
        pool = self._pools.get((node_id, principal))
        if pool is None:
            assert self._service_nursery is not None
            pool = LanePool(
                node_id,
                lambda: self.nodes.upstream(node_id),
                lanes=self.rules.coalescing.lanes,
                nursery=self._service_nursery,
                max_frame_bytes=self.rules.limits.max_frame_bytes,
                stats=self.stats,
                principal=principal,
                dial=lambda address: self._security().dial(address, principal),
                report=self.limits.reporter.reached,
                answer_timeout=self.config.upstream_request_timeout_seconds,
            )
            self._pools[(node_id, principal)] = pool
        return pool

    def _security(self) -> Security:
        assert self.security is not None, "serve() loads it before any connection"
        return self.security

    def default_node(self) -> int | None:
        """The node that serves bootstrap connections' shared traffic (a live one)."""
        known = self.nodes.live_nodes()
        for upstream in self.config.upstreams:
            for node_id, address in known.items():
                if address == upstream:
                    return node_id
        return min(known) if known else None

    # Lifecycle -------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        try:
            security = self.security = Security(
                tls=config.tls,
                upstream_tls=config.upstream_tls,
                sasl_credentials=config.sasl_credentials,
                sasl_upstream=config.sasl_upstream,
            )
        except SecurityError as exc:
            raise StartupError(str(exc)) from None
        problems: list[str] = []
        found: list[tuple[int, str, int]] | None = None
        with trio.move_on_after(self.config.discovery_timeout_seconds):
            try:
                found = await discover_nodes(
                    self.config.upstreams,
                    problems,
                    lambda address: security.dial(address, security.kipside_principal()),
                    tls=security.upstream_tls is not None,
                )
            except NotKafkaError:
                raise StartupError(
                    f"no upstream broker speaks plaintext Kafka ({'; '.join(problems)})"
                ) from None
        if found is None:
            raise StartupError(
                f"no upstream broker answered within {self.config.discovery_timeout_seconds:g} s "
                f"({'; '.join(problems)}); check --upstream and that the brokers are running "
                "(--discovery-timeout waits longer)"
            )
        bootstrap = _bind(self.config.listen.host, self.config.listen.port)
        try:  # both bound before anything runs: a taken port is one error line, not a traceback
            admin = None if config.admin is None else _bind(config.admin.host, config.admin.port)
        except StartupError:
            bootstrap.socket.close()
            raise
        bootstrap_port = bootstrap.socket.getsockname()[1]
        self.bootstrap_address = Address(self.config.listen.host, bootstrap_port)
        if self.nodes.node_port_base is None:
            self.nodes.node_port_base = bootstrap_port + 1
        async with trio.open_nursery() as service_nursery:
            self._service_nursery = service_nursery
            shared = None
            if self.config.share_connections:
                context = FeatureContext(
                    self.pool,
                    self.default_node,
                    lambda: self.rules,
                    self.stats,
                    service_nursery,
                    self.tracer if self.tracer.active else None,
                )
                shared = (context, self.nodes)
            terminates = self._security().sasl_termination() is not None
            self.stages = Stages.build(lambda: self.rules, self.versions, shared, terminates)
            await self._serve_sessions(bootstrap, admin, found, task_status)
            service_nursery.cancel_scope.cancel()
        self.tracer.shutdown()
        self.metrics.shutdown()
        produce = ApiKey.PRODUCE
        log.info(
            "stopped; Produce requests: %d from clients, %d upstream",
            self.stats.client_requests[produce],
            self.stats.upstream_requests[produce],
        )

    async def _serve_sessions(
        self,
        bootstrap: trio.SocketListener,
        admin: trio.SocketListener | None,
        found: list[tuple[int, str, int]],
        task_status: trio.TaskStatus[None],
    ) -> None:
        async with trio.open_nursery() as session_nursery:
            self._session_nursery = session_nursery
            async with trio.open_nursery() as listener_nursery:
                self._listener_nursery = listener_nursery
                for node_id, host, port in found:
                    self.nodes.learn(node_id, host, port)
                listener_nursery.start_soon(
                    self._serve_listener, bootstrap, self._bootstrap_session
                )
                if admin is not None and self.config.admin is not None:
                    listener_nursery.start_soon(serve_admin, admin, AdminApp(self))
                    print(
                        f"kipside: admin listening on http://{self.config.admin.host}:"
                        f"{admin.socket.getsockname()[1]}",
                        flush=True,
                    )
                print(f"kipside: bootstrap listening on {self.bootstrap_address}", flush=True)
                listener_tls = self._security().listener_tls
                if listener_tls is not None:
                    certificates = CertificateReloader(listener_tls)
                    self.reloader.on_sighup.append(certificates.on_sighup)
                    listener_nursery.start_soon(certificates.watch)
                await listener_nursery.start(self.reloader.run)  # SIGHUP and file changes
                print("kipside: ready", flush=True)
                self.ready.set()
                task_status.started()
                await self._wait_for_shutdown_signal()
                log.info("shutting down: no new connections; draining %d", len(self.sessions))
                listener_nursery.cancel_scope.cancel()
            for session in list(self.sessions):
                session.drain()
            with trio.move_on_after(self.config.shutdown_grace_seconds):
                while self.sessions:
                    self._session_ended = trio.Event()
                    await self._session_ended.wait()
            if self.sessions:
                log.warning(
                    "shutdown deadline (%g s) reached; closing %d connections",
                    self.config.shutdown_grace_seconds,
                    len(self.sessions),
                )
            session_nursery.cancel_scope.cancel()

    def request_shutdown(self) -> None:
        """Shut down as on SIGTERM (for embedding; call from the server's trio thread)."""
        self._shutdown_requested.set()

    async def _wait_for_shutdown_signal(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            # Signals reach only the main thread; an embedded server stops on request.
            await self._shutdown_requested.wait()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._on_signal, nursery.cancel_scope)
            await self._shutdown_requested.wait()
            nursery.cancel_scope.cancel()

    async def _on_signal(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self.request_shutdown()
                return


def run(config: ServerConfig) -> int:
    try:
        trio.run(Server(config).serve)
    except StartupError as exc:
        print(f"kipside: error: {exc}", file=sys.stderr)
        return 2
    return 0
