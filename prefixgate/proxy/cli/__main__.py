"""``python -m prefixgate.proxy.cli``: the ``prefixgate`` command (as ``python -m prefixgate``)."""

from prefixgate.proxy.cli import app

app()
