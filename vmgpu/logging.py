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


def get_logger(**bound):
    """A bound logger; logs go to stderr as JSON until configure() says otherwise (never to
    stdout, which belongs to the command's output)."""
    if not structlog.is_configured():
        configure(json=True)
    return structlog.get_logger(**bound)
