"""PostgreSQL for the shared-ledger tests: the machine's server (a throwaway database per test
session, dropped after) and a private cluster of the test's own that a test may stop and start.

Where the machine's server is: ``$PREFIXGATE_TEST_PG`` (a ``postgresql://`` URL of a database a
superuser may create databases from), else the first of 127.0.0.1:5432 and 127.0.0.1:55432 (the
cluster ``.ci/postgres`` starts when 5432 is missing) that takes user ``postgres`` without a
password. The machine's server is never stopped by a test: outages are a :class:`PrivateCluster`
(Debian's ``initdb`` / ``pg_ctl`` on a free loopback port, data in a temp folder; run as the
``postgres`` user when the tests run as root, since PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import psycopg

CANDIDATES = ("postgresql://postgres@127.0.0.1:5432/postgres",
              "postgresql://postgres@127.0.0.1:55432/postgres")


def admin_url() -> str | None:
    """A reachable server's admin URL (module docstring), or None."""
    env = os.environ.get("PREFIXGATE_TEST_PG")
    for url in ([env] if env else list(CANDIDATES)):
        try:
            with psycopg.connect(url, connect_timeout=2):
                return url
        except psycopg.Error:
            continue
    return None


def with_db(url: str, db: str) -> str:
    """``url`` naming database ``db`` instead."""
    return url.rsplit("/", 1)[0] + "/" + db


def create_db(admin: str) -> str:
    """Create a fresh database ``prefixgate_test_<hex>``; return its URL."""
    name = f"prefixgate_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return with_db(admin, name)


def drop_db(admin: str, url: str) -> None:
    """Drop the database of ``url`` (its connections ended first)."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    """Debian's PostgreSQL binaries folder (the newest version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class PrivateCluster:
    """A throwaway cluster in ``data`` on 127.0.0.1:``port`` (trust auth, fsync off):
    :meth:`start`, :meth:`stop` (fast shutdown: what a crash or a restart looks like to a
    client), :attr:`url` of its ``postgres`` database."""

    def __init__(self, data: Path, port: int) -> None:
        bindir = pg_bin()
        if bindir is None:
            raise RuntimeError("Debian's PostgreSQL binaries are not installed")
        self.bin, self.data, self.port = bindir, data, port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, "postgres", "postgres")
            shutil.chown(data.parent, "postgres", "postgres")
        self._as_pg([str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"])

    def _as_pg(self, argv: list[str]) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start it and wait until it accepts connections."""
        self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                     str(self.data / "server.log"), "-w", "-t", "60", "-o",
                     f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off",
                     "start"])

    def stop(self) -> None:
        """Stop it (``-m fast``: clients are disconnected at once)."""
        self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])
