"""`convmem serve [--data-dir DIR] [--log-level L] [--http [--host H] [--port P] [--no-stdio]]`:
a Runtime with a stdio listener and, with `--http`, the HTTP listener (`POST /mcp`). No Qt.

Takes the data-dir lock itself; when another process holds it, prints one line on stderr and
exits with status 2 (1 when the store cannot be opened: corrupt or unreadable). Logs go to
stderr and never contain message content; stdout carries only MCP.

The session ends on stdin EOF (after answering what was already asked), SIGTERM or Ctrl-C. A
signal stops reading and gives the requests already read `STOP_GRACE_SECONDS` to finish and be
answered; a second signal cuts that short. Then the runtime stops: every write the client saw
acknowledged was fsynced before the acknowledgement, and the store closes and releases the lock
whatever signals arrive meanwhile.

With `--http` the HTTP listener serves too (docs/hosts.md, "Over HTTP"); a busy port is one
line naming the port and exit status 3. With `--no-stdio` stdin is not read at all: the process
serves HTTP until SIGTERM or Ctrl-C (stdin at EOF does not stop it), then releases the port.

Where the data dir is when `--data-dir` is not given is the caller's to say (`resolve_data_dir`):
`convmem_app.cli` passes the one definition that the shim also uses (`convmem_app.shim.paths`,
standard library only), so the engine never imports the app and the rule exists once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from convmem_engine.runtime.http_listener import HttpOptions, add_http_arguments, http_options
from convmem_engine.runtime.logs import configure_logging
from convmem_engine.runtime.stdio_listener import private_stdout

if TYPE_CHECKING:
    from mcp.server import Server

    from convmem_engine.agent.config import AgentConfig
    from convmem_engine.agent.part import AgentPart
    from convmem_engine.runtime.front import StdioFront
    from convmem_engine.runtime.runtime import Runtime
    from convmem_engine.service import MemoryService

logger = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_BUSY: Final = 2
EXIT_LISTEN: Final = 3
"""The HTTP listener could not start (port in use, address refused, unusable token)."""
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
STOP_GRACE_SECONDS: Final = 5.0
"""After SIGTERM / Ctrl-C: how long requests already read may take to finish and be answered."""
POLL_SECONDS: Final = 0.1
FRONT_IDLE_SECONDS: Final = 2.0
"""After the open: how long the SDK's import waits for the front to answer what it has read."""

_STOP_SIGNALS: Final = tuple(
    sig
    for sig in (
        getattr(signal, "SIGINT", None),
        getattr(signal, "SIGTERM", None),
        getattr(signal, "SIGBREAK", None),
    )
    if sig is not None
)

ResolveDataDir = Callable[[str | None], Path]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="convmem serve",
        description="Serve ConvMem's memory tools over MCP on stdin/stdout.",
    )
    parser.add_argument(
        "--data-dir",
        help="store directory (default: $CONVMEM_DATA_DIR, else the per-user data folder)",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="stderr log level (default: WARNING)",
    )
    add_http_arguments(parser)
    args = parser.parse_args(argv)
    if args.no_stdio and not args.http:
        parser.error("--no-stdio needs --http (there would be nothing to serve)")
    return args


@contextmanager
def _counting_stop_signals(opening: list[bool] | None = None) -> Iterator[list[int]]:
    """Count stop signals (the handler only counts: the main thread acts on the count). While
    `opening[0]` is true (the runtime opens: nothing can stop it yet) a second signal ends the
    process at once, as the signal's default action (every write already answered is durable)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)
        if opening is not None and opening[0] and len(received) > 1:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    previous = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def agent_runtime(
    data_dir: Path,
    *,
    before_server: Callable[[MemoryService, AgentPart], None] | None = None,
    search_gate: threading.Event | None = None,
    read_agent_config: Callable[[str | os.PathLike[str]], AgentConfig] | None = None,
) -> tuple[Runtime, AgentPart]:
    """A runtime whose parts include the memory agent's queue (`agent.yaml`), whose MCP server
    carries `agent_run`/`agent_status` and the Tasks extension, and whose sessions admit an
    `agent_run` with the configured maximum images. `before_server(service, part)` runs once
    the service is open and the parts have started, before the server (and the SDK) loads;
    `search_gate`: the service's background search build waits for it (`MemoryService`);
    `read_agent_config(data_dir)`: the agent's settings (default: `agent.yaml`)."""
    from convmem_engine.agent.part import AgentPart
    from convmem_engine.runtime.runtime import Runtime
    from convmem_engine.service import MemoryService

    def open_service(folder: Path, on_locked: Callable[[], None] | None) -> MemoryService:
        return MemoryService.open(folder, on_locked=on_locked, search_gate=search_gate)

    part = AgentPart(read_config=read_agent_config)

    def build(service: MemoryService) -> Server[Any]:
        if before_server is not None:
            before_server(service, part)
        from convmem_engine.mcp.agent_tools import build_agent_server, transport_line_limit

        assert part.agent is not None  # parts start before the server is built
        server = build_agent_server(service, part.agent)
        runtime.max_line_bytes = transport_line_limit(part.agent.config)
        return server

    runtime = Runtime(data_dir, parts=[part], open_service=open_service, build_server=build)
    return runtime, part


def _config_as_front_saw(front: StdioFront) -> Callable[[str | os.PathLike[str]], AgentConfig]:
    """The agent's settings as of the front's start: the defaults (the agent off) when the data
    dir had no `agent.yaml` then, since `tools/list` may have been answered without the agent's
    tools already (`listChanged` is false: the list must not change within the process)."""

    def read(data_dir: str | os.PathLike[str]) -> AgentConfig:
        from convmem_engine.agent.config import AgentConfig, load_config

        return AgentConfig() if front.agent_config_absent else load_config(data_dir)

    return read


def _front_serves_tools(
    front: StdioFront, search_gate: threading.Event, signals: list[int]
) -> Callable[[MemoryService, AgentPart], None]:
    """Once the service is open and the agent part has started: the front may answer the
    memory tools' calls (and `tools/list` when the agent is off); the search index's
    background load starts once it has answered what it has read (or after
    `FRONT_IDLE_SECONDS`), so as not to take the GIL from those first answers, and the SDK's
    import once that load or build is done (`sdk_after_search_index`)."""

    def serve_tools(service: MemoryService, part: AgentPart) -> None:
        from convmem_engine.tools import ToolRegistry

        assert part.agent is not None
        try:
            front.serve_tools(
                ToolRegistry.for_service(service), agent_enabled=part.agent.config.enabled
            )
            front.wait_idle(FRONT_IDLE_SECONDS)
        finally:
            search_gate.set()
        sdk_after_search_index(front, service, signals)

    return serve_tools


def sdk_after_search_index(front: StdioFront, service: MemoryService, signals: list[int]) -> None:
    """Wait, while the front answers every request, until the search index's background load
    or build is done: the SDK (~40 MiB with pydantic and the protocol's models) is imported
    after it, not beside it. A build's own high point (its last containers, the tables made
    after them) then comes before the SDK's memory is there: at a million messages the start
    that rebuilds search.idx peaks ~8 MiB lower over its whole life; a restart loads the index
    in ~1 s, alone. The wait ends at once when the front stops answering (a request it leaves
    to the SDK: the SDK is imported for it now), at the end of stdin, or at a stop signal:
    nothing waits for the index that did not before."""
    while not signals and front.answering and not service.wait_for_search_index(POLL_SECONDS):
        pass


def serve(data_dir: Path, http: HttpOptions | None = None) -> int:
    """Serve MCP on stdin/stdout (and over HTTP with `http`) for the store in `data_dir` until
    EOF or a stop signal (only a stop signal with `http.no_stdio`).

    Start order: the data dir's lock is taken first; from then on the stdio front
    (`front.py`) reads stdin and answers the handshake, then `tools/list` and `ping`, while the
    store opens; once it is open (and the parts have started) the front answers the memory
    tools' calls too, and the SDK is imported once it has answered what it has read and the
    search index's background load or build is done (`sdk_after_search_index`); when the
    runtime is running the stdio session takes the stream over (the requests the front did not
    answer are served then)."""
    from convmem_engine.runtime.front import StdioFront

    with private_stdout() as out_fd:  # from here on, a stray print lands on stderr
        stdio = http is None or not http.no_stdio
        front = None
        if stdio:  # with --http the HTTP listener may yet fail: no tool call before it is up
            answer = None if http is None else False
            front = StdioFront(
                sys.stdin.fileno(), out_fd, data_dir=data_dir, answer_requests=answer
            )

        def locked() -> None:
            if front is not None:
                front.start()

        # counted from before the open: the front may answer tool calls while it runs, and a
        # stop signal then lets them finish and be answered as it does later
        opening = [True]
        with _counting_stop_signals(opening) as signals:
            gate = None if front is None else threading.Event()
            early = (
                None if front is None or gate is None else _front_serves_tools(front, gate, signals)
            )
            runtime, _agent = agent_runtime(
                data_dir,
                before_server=early,
                search_gate=gate,
                read_agent_config=None if front is None else _config_as_front_saw(front),
            )
            try:
                runtime.open(on_locked=locked)
            except Exception as error:
                from convmem_engine.agent import AgentConfigError
                from convmem_engine.agent.store import AgentStoreError
                from convmem_engine.domain.errors import BusyError, ConvMemError

                if isinstance(error, ConvMemError):
                    status = EXIT_BUSY if isinstance(error, BusyError) else EXIT_ERROR
                    line = f"{error.code}: {data_dir}: {error.message}"
                    reason = f"{error.code}: {error.message}"
                elif isinstance(error, AgentConfigError | AgentStoreError | OSError):
                    status = EXIT_ERROR
                    line = reason = f"agent: {error}"
                else:
                    if front is not None:
                        front.fail("convmem serve could not start: INTERNAL_ERROR")
                    raise
                if front is not None:  # requests already read get an answer saying why
                    front.fail(f"convmem serve could not start: {reason}")
                print(f"convmem serve: {line}", file=sys.stderr)
                return status
            opening[0] = False
            over = "HTTP" if http is not None and http.no_stdio else "stdio"
            logger.info("serving %s over %s (pid %d)", data_dir, over, os.getpid())
            if sys.stdin.isatty() and (http is None or not http.no_stdio):
                print(
                    "convmem serve: speaking MCP on stdin/stdout for an LLM host "
                    "(see docs/hosts.md); press Ctrl-C to stop",
                    file=sys.stderr,
                )
            if http is not None and not _start_http(runtime, http):
                if front is not None:  # (start_http printed why on stderr)
                    front.fail("convmem serve could not start: the HTTP listener failed")
                runtime.stop(0)
                return EXIT_LISTEN
            if http is not None and http.no_stdio:
                while not signals:  # stdin is never read: its EOF does not stop us
                    time.sleep(POLL_SECONDS)
            else:
                from convmem_engine.runtime.stdio_listener import StdioListener

                if front is not None:
                    front.stop_answering()  # its request in progress is answered first
                listener = StdioListener(sys.stdin.fileno(), out_fd, front=front)
                runtime.add_listener(listener)
                while not signals and not listener.finished.wait(POLL_SECONDS):
                    pass
            if signals:
                logger.info("stop signal: answering requests in progress, then exiting")
            stopped = runtime.stop_async(STOP_GRACE_SECONDS)
            forced = False
            while True:
                try:
                    stopped.result(timeout=POLL_SECONDS)
                    break
                except concurrent.futures.TimeoutError:
                    if len(signals) > 1 and not forced:  # a second signal: stop now
                        runtime.stop_async(0)
                        forced = True
    logger.info("stopped")
    return EXIT_OK


def _start_http(runtime: Runtime, http: HttpOptions) -> bool:
    from convmem_engine.runtime.http_listener import start_http

    return start_http(runtime, http)


def main(argv: list[str], *, resolve_data_dir: ResolveDataDir) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    return serve(resolve_data_dir(args.data_dir), http_options(args))
