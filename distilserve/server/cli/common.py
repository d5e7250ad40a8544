"""What the commands share: their refusals, argument types, status line, optional
extras, listening sockets and the warning of an open host."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path


@contextlib.contextmanager
def status(label: str):
    """A live status line on stderr; yields a progress(step) function that also logs."""
    from rich.console import Console

    console = Console(stderr=True, log_path=False)  # (the caller would always be progress)
    with console.status(label) as line:
        def progress(step: str) -> None:
            line.update(step)
            console.log(step)

        yield progress


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``low`` (argparse's one-line error
    otherwise)."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        return value
    return whole


def positive(text: str) -> float:
    """An argparse type: a finite number over 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number over 0")
    return value


class Refused(Exception):
    """What a command was given and cannot run: main() prints ``distilserve COMMAND:
    message``, one line, and exits 2."""

    @classmethod
    def invalid(cls, error) -> Refused:
        """A setting that does not validate (pydantic's ValidationError): its first error."""
        first = error.errors()[0]
        where = f"{first['loc'][0]}: " if first["loc"] else ""
        said = first["ctx"]["error"] if first["type"] == "value_error" else first["msg"]
        return cls(f"{where}{said}")  # (a validator's own words, without "Value error, ")


# what each optional feature needs: (the extra that installs it, the modules it imports)
EXTRAS = {"--grpc-port": ("grpc", ("grpc_health", "grpc_reflection", "grpc_tools",
                                   "tritonclient.grpc")),
          "distilserve ray": ("ray", ("ray.serve",)),
          "DISTILSERVE_OTLP_ENDPOINT": ("otlp", ("opentelemetry.sdk.trace",
                                                 "opentelemetry.exporter.otlp.proto.http")),
          "DISTILSERVE_TOKEN_IDS": ("token-ids", ("bpe_openai",))}


def require(feature: str) -> None:
    """A one-line refusal of ``feature`` (one of EXTRAS) where its extra is not
    installed."""
    import importlib

    extra, modules = EXTRAS[feature]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise Refused(f"{feature} needs the {extra} extra (pip install -c constraints.txt "
                          f"'distilserve[{extra}]'): {e}") from None


def buildable_default(cache_dir: Path) -> None:
    """A one-line refusal where the embedded default is not built in the cache folder
    ``cache_dir`` (DISTILSERVE_CACHE_DIR) and cannot be: a folder that cannot be made or
    written."""
    from distilserve.server import embedded_default

    if embedded_default.is_built(cache_dir):
        return
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache_dir).close()
    except OSError as e:
        raise Refused(f"cannot build the embedded default in {cache_dir} "
                      f"(DISTILSERVE_CACHE_DIR): {e.strerror or e}") from None


def listening_socket(host: str, port: int):
    """A bound socket on host:port (as uvicorn binds: SO_REUSEADDR, IPv6 for a ':' host)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or localhost): reachable from this machine
    only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def warn_if_open(settings, routes: str) -> None:
    """Warns that ``routes`` are open to anyone where no DISTILSERVE_API_KEY is set and the
    host is reachable from elsewhere (0.0.0.0, the image's)."""
    if not settings.bearer_key() and not loopback(settings.host):
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        logging.getLogger("distilserve").warning(
            "no DISTILSERVE_API_KEY: every route (%s) is open to whoever reaches %s; set a "
            "key, or put the service behind a proxy that authenticates", routes, host)


# what a serving process opens besides its clients' connections: model files, pipes,
# gRPC's connections, the engine process's socket
OTHER_FILES = 1024


def open_files_for(connections: int) -> None:
    """Raises this process's soft limit of open files (its workers and engine process
    inherit it) to what ``connections`` clients and the rest need, up to the hard limit, as
    vLLM's server does: past the soft limit (1024 in many a shell) a connection fails
    unanswered, and nothing says why. Warns where the hard limit is lower."""
    import resource

    wanted = connections + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        logging.getLogger("distilserve").warning(
            "open files: at most %d (the hard limit), for DISTILSERVE_MAX_CONNECTIONS %d "
            "clients and the %d files a process opens besides: connections past it fail "
            "unanswered; raise the hard limit (ulimit -Hn, a container's nofile) or "
            "lower DISTILSERVE_MAX_CONNECTIONS", target, connections, OTHER_FILES)
