"""prefixgate: a reverse proxy that rewrites agent requests for prefix-cache reuse.

The five parts live under this one top-level package so that installing prefixgate never shadows
a user's own ``config``, ``cache`` or ``proxy`` module: ``prefixgate.config`` (policy schema, prices),
``prefixgate.rewriter`` (pure prompt rewriting), ``prefixgate.cache`` (ledger, session memory,
provider cache models), ``prefixgate.local_engine`` (the torch engine, reached over HTTP) and
``prefixgate.proxy`` (the HTTP surface and CLI).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("prefixgate")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
