"""Progress of the long steps a command runs (issue 22, item 1): say what is happening, then how
long it took — a ``rich`` spinner where a terminal is attached, plain lines otherwise (make, CI,
a log file)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console


@contextmanager
def step(what: str) -> Iterator[None]:
    """``with step("starting the local engine"):`` prints ``what ...`` (or shows a spinner on a
    terminal) and, when the block ends normally, ``what: done in 12.3 s``; on stderr."""
    console = Console(stderr=True)
    started = time.monotonic()
    if console.is_terminal:
        with console.status(f"{what} ..."):
            yield
    else:
        typer.echo(f"{what} ...", err=True)
        yield
    typer.echo(f"{what}: done in {time.monotonic() - started:.1f} s", err=True)
