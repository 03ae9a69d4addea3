"""The `kipside` command line: the sidecar (serve, dev), rule files, credentials, and the
commands other packages register (mirror, lake, pcap).

Parses arguments into a ServerConfig and hands over to proxy.server, or to proxy.dev for `dev`
(the embedded broker and the live console). Errors a user can act on are printed as one line and
exit with status 2; nothing here knows the Kafka protocol.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version

from kipside.protocol import (
    SCRAM_DEFAULT_ITERATIONS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    Address,
    scram_credential,
)
from kipside.proxy.arguments import KipsideParser, UsageError
from kipside.proxy.security import (
    CredentialsError,
    CredentialStore,
    load_credentials,
    with_user,
    write_credentials,
)
from kipside.proxy.security.certificates import ListenerTlsFiles, UpstreamTlsFiles
from kipside.proxy.server import DEFAULT_DISCOVERY_TIMEOUT_SECONDS, ServerConfig, run
from kipside.proxy.telemetry.tracing import TraceConfig
from kipside.proxy.upstream.connection import DEFAULT_ANSWER_TIMEOUT_SECONDS
from kipside.rules import RuleError, RuleSet, default_rules, load_rules


def parse_address(
    text: str, *, what: str, default_port: int | None = None, any_port: bool = False
) -> Address:
    """Address.parse for a command-line option; its problem as a UsageError."""
    try:
        return Address.parse(text, what=what, default_port=default_port, any_port=any_port)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _admin_address(text: str) -> Address:
    # The admin endpoint has no authentication: a bare port stays on loopback.
    address = f"127.0.0.1:{text}" if text.isdigit() else text
    return parse_address(address, what="--admin", any_port=True)


def _grace_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} s: give a number of seconds, 0 or more")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} s: give a number of seconds above 0")
    return value


def _load_rules(path: str | None) -> RuleSet:
    return default_rules() if path is None else load_rules(path)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _add_proxy_options(
    parser: argparse.ArgumentParser, *, listen_default: str | None, dev: bool = False
) -> None:
    """The options `serve` and `dev` share, in the order `--help` lists them."""
    _add_listener_options(parser, listen_default)
    _add_operation_options(parser, dev)
    _add_upstream_options(parser)
    _add_tracing_options(parser)
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning"],
        help="how much kipside logs to stderr; debug adds a line per connection event",
    )
    _add_client_tls_options(parser)


def _add_listener_options(parser: argparse.ArgumentParser, listen_default: str | None) -> None:
    parser.add_argument(
        "--listen",
        default=listen_default,
        required=listen_default is None,
        metavar="HOST:PORT",
        help="the bootstrap listener, the address clients use as bootstrap.servers"
        + (" (required)" if listen_default is None else ""),
    )
    parser.add_argument(
        "--advertise",
        metavar="HOST",
        help="host name handed to clients in broker addresses (default: the --listen host)",
    )
    parser.add_argument(
        "--node-port-base",
        type=int,
        metavar="PORT",
        help="node N listens on PORT+N (default: the bootstrap port + 1)",
    )


def _add_operation_options(parser: argparse.ArgumentParser, dev: bool) -> None:
    parser.add_argument("--rules", metavar="FILE", help="YAML rule file (see docs/rules.md)")
    parser.add_argument(
        "--admin",
        metavar="[HOST:]PORT",
        help="serve the admin endpoint over HTTP here: status page, /metrics, /healthz, "
        "/readyz, /rules, POST /rules/reload (a bare PORT binds 127.0.0.1; "
        "see docs/observability.md)"
        + ("; default here: 127.0.0.1:9644, and 0 picks a free port" if dev else ""),
    )
    parser.add_argument(
        "--shutdown-grace",
        type=_grace_seconds,
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long in-flight requests may take to finish before the "
        "connections left are closed",
    )


def _add_upstream_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--discovery-timeout",
        type=_positive_seconds,
        default=DEFAULT_DISCOVERY_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="at start, how long to keep asking the bootstrap brokers for the cluster's nodes "
        "before giving up with the reason (exit status 2)",
    )
    parser.add_argument(
        "--upstream-request-timeout",
        type=_positive_seconds,
        default=DEFAULT_ANSWER_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="close a broker connection (a shared lane, or a client's own) whose oldest request "
        "has had no answer for this long, or for its own timeout_ms if longer; its clients "
        "resend "
        f"(default {DEFAULT_ANSWER_TIMEOUT_SECONDS:g}, Kafka's request.timeout.ms)",
    )
    parser.add_argument(
        "--one-to-one",
        action="store_true",
        help="give every client connection its own upstream connection (no lanes, no coalescing)",
    )


def _add_tracing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        help="export traces over OTLP http/protobuf to URL (e.g. http://collector:4318); "
        "default: $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing",
    )
    parser.add_argument(
        "--trace-console",
        action="store_true",
        help="print one line per span to stdout",
    )


def _add_client_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS toward clients (every listener; see docs/running.md)")
    tls.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain) clients see")
    tls.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="mutual TLS: clients must present a certificate signed by a CA in FILE; its "
        "subject becomes the client's principal",
    )


def _add_upstream_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS toward brokers (see docs/running.md)")
    tls.add_argument(
        "--upstream-ca",
        metavar="FILE",
        help="turn TLS on toward every broker; FILE: the PEM CA that signed their certificates",
    )
    tls.add_argument("--upstream-cert", metavar="FILE", help="PEM client certificate for brokers")
    tls.add_argument("--upstream-key", metavar="FILE", help="PEM private key of --upstream-cert")
    tls.add_argument(
        "--upstream-server-name",
        metavar="NAME",
        help="check every broker's certificate against NAME and send it as SNI "
        "(default: the broker's host)",
    )


def _add_sasl_options(parser: argparse.ArgumentParser) -> None:
    sasl = parser.add_argument_group("SASL (see docs/security.md)")
    sasl.add_argument(
        "--sasl-credentials",
        metavar="FILE",
        help="kipside authenticates clients itself (PLAIN, SCRAM-SHA-256/512) against FILE, "
        "written by `kipside credentials add`; without it, clients' SASL passes through",
    )
    sasl.add_argument(
        "--sasl-upstream",
        metavar="FILE",
        help="per principal, how kipside logs in to the brokers (mechanism, user name, a "
        "password file or environment variable); `discovery:` names kipside's own login",
    )


def _add_credentials_command(sub: argparse._SubParsersAction[KipsideParser]) -> None:
    credentials = sub.add_parser("credentials", help="write a --sasl-credentials file")
    credentials_sub = credentials.add_subparsers(dest="credentials_command", required=True)
    add = credentials_sub.add_parser(
        "add",
        help="add or replace a user; the password is read from standard input (or a prompt)",
    )
    add.add_argument("file", help="the credentials file (created if missing; mode 0600)")
    add.add_argument("user", help="the user name clients log in with")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="write this SCRAM mechanism's entry (repeatable; default: both; PLAIN logins "
        "are checked against either)",
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=SCRAM_DEFAULT_ITERATIONS,
        metavar="N",
        help=f"SCRAM's PBKDF2 iterations, {SCRAM_MIN_ITERATIONS}-{SCRAM_MAX_ITERATIONS} as "
        "Apache Kafka allows; more makes each login slower to check and to guess",
    )
    add.set_defaults(handler=_credentials_add)


def _read_password(user: str) -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass(f"password for {user}: ")
    if getpass.getpass("again: ") != password:
        raise UsageError("the two passwords differ; nothing was written")
    return password


def _credentials_add(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.user)
        if not password:
            raise UsageError("empty password; nothing was written")
        store = (
            load_credentials(args.file)
            if os.path.exists(args.file)
            else CredentialStore(args.file, {})
        )
        mechanisms = args.mechanism or list(SCRAM_MECHANISMS)
        entries = [scram_credential(m, password, iterations=args.iterations) for m in mechanisms]
        write_credentials(args.file, with_user(store, args.user, entries))
    except (UsageError, CredentialsError, ValueError) as exc:
        print(f"kipside: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"kipside: {args.file}: {args.user}: {', '.join(mechanisms)} "
        f"({args.iterations} iterations); the password itself is not stored",
        file=sys.stderr,
    )
    return 0


_DESCRIPTION = """\
kipside: a Kafka wire-protocol sidecar (multi-batch produce, transaction pre-registration,
shared broker connections) and the data pipelines that share its protocol code."""


def _version() -> str:
    try:
        return version("kipside")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = KipsideParser(prog="kipside", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"kipside {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="proxy clients to upstream Kafka brokers")
    serve.add_argument(
        "--upstream",
        required=True,
        metavar="HOST[:PORT][,...]",
        help="the bootstrap brokers, comma-separated, e.g. kafka-1:9092,kafka-2:9092; "
        "PORT defaults to 9092 (required)",
    )
    _add_proxy_options(serve, listen_default=None)
    _add_upstream_tls_options(serve)
    _add_sasl_options(serve)

    dev = sub.add_parser("dev", help="start the embedded Tansu broker with kipside in front")
    _add_proxy_options(dev, listen_default="127.0.0.1:9092", dev=True)
    dev.add_argument(
        "--broker-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port for Tansu itself (default: any free port)",
    )

    rules = sub.add_parser("rules", help="work with rule files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate a rule file, print the effective rules")
    check.add_argument("file", help="the YAML rule file (see docs/rules.md)")
    _add_credentials_command(sub)
    _add_plugin_commands(sub)
    return parser


def _add_plugin_commands(sub: argparse._SubParsersAction[KipsideParser]) -> None:
    """Subcommands registered by other parts of kipside (the Spark pipelines) through the
    `kipside.commands` entry point group; each sets `handler` on its parser."""
    for entry in entry_points(group="kipside.commands"):
        register = entry.load()
        register(sub)


def _config(args: argparse.Namespace, upstreams: list[Address]) -> ServerConfig:
    return ServerConfig(
        upstreams=upstreams,
        listen=parse_address(args.listen, what="--listen", any_port=True),
        advertise_host=args.advertise,
        node_port_base=args.node_port_base,
        rules=_load_rules(args.rules),
        shutdown_grace_seconds=args.shutdown_grace,
        discovery_timeout_seconds=args.discovery_timeout,
        upstream_request_timeout_seconds=args.upstream_request_timeout,
        share_connections=not args.one_to_one,
        admin=_admin_address(args.admin) if args.admin else None,
        trace=_trace_config(args),
        tls=_listener_tls(args),
        upstream_tls=_upstream_tls(args),
        sasl_credentials=getattr(args, "sasl_credentials", None),
        sasl_upstream=getattr(args, "sasl_upstream", None),
    )


def _listener_tls(args: argparse.Namespace) -> ListenerTlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise UsageError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise UsageError(
            "--tls-cert and --tls-key go together: the PEM certificate clients see and its key"
        )
    return ListenerTlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)


def _upstream_tls(args: argparse.Namespace) -> UpstreamTlsFiles | None:
    ca = getattr(args, "upstream_ca", None)  # `kipside dev`'s own broker is plaintext
    cert, key = getattr(args, "upstream_cert", None), getattr(args, "upstream_key", None)
    name = getattr(args, "upstream_server_name", None)
    if ca is None:
        if cert or key or name:
            raise UsageError(
                "--upstream-cert, --upstream-key and --upstream-server-name need --upstream-ca "
                "FILE (the CA that signed the brokers' certificates), which turns TLS on"
            )
        return None
    if (cert is None) != (key is None):
        raise UsageError("--upstream-cert and --upstream-key go together")
    return UpstreamTlsFiles(ca, cert, key, name)


def _trace_config(args: argparse.Namespace) -> TraceConfig:
    if args.otlp_endpoint:
        return TraceConfig("otlp", args.otlp_endpoint)
    if args.trace_console:
        return TraceConfig("console")
    return TraceConfig("none")


def _dev(args: argparse.Namespace) -> int:
    from kipside.proxy.dev import run_dev

    # The embedded broker becomes the upstream once it runs.
    return run_dev(_config(args, []), args.broker_port)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    _setup_logging(getattr(args, "log_level", "info"))
    try:
        if args.command == "serve":
            upstreams = [
                parse_address(part.strip(), what="--upstream", default_port=9092)
                for part in args.upstream.split(",")
                if part.strip()
            ]
            if not upstreams:
                raise UsageError("--upstream needs at least one HOST:PORT")
            return run(_config(args, upstreams))
        if args.command == "dev":
            return _dev(args)
        ruleset = load_rules(args.file)
        # Source and version first, then the sections in rule-file order (as GET /rules).
        print(json.dumps(ruleset.describe(), indent=2))
        print(f"kipside: {args.file}: OK (version {ruleset.version})", file=sys.stderr)
        return 0
    except (UsageError, RuleError) as exc:
        print(f"kipside: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
