"""structlog, configured once: JSON lines for the daemon and hooks, readable lines for the CLI.
Fixed keys: guest, gpu, channel, request_id."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(json: bool = True, stream=None) -> None:
    """Call once at process start (the daemon, a hook, the CLI)."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def configure_file(path: str) -> None:
    """JSON lines appended to path (a hook's or a runtime's log: their stderr is read by
    libvirt or docker as an error message); stderr if path cannot be opened."""
    from pathlib import Path

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        stream = open(path, "a", buffering=1)
    except OSError:
        stream = sys.stderr
    configure(json=True, stream=stream)


def get_logger(**bound):
    """A bound logger; logs go to stderr as JSON until configure() says otherwise (never to
    stdout, which belongs to the command's output)."""
    if not structlog.is_configured():
        configure(json=True)
    return structlog.get_logger(**bound)
