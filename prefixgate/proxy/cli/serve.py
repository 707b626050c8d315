"""``prefixgate serve`` (engine + proxy) and ``prefixgate engine`` (the engine alone).

``serve [--policy FILE] [--model DIR] [--host H] [--port P]``: loads the policy (default: the
shipped one: hosted models to their APIs, the local engine by its id), spawns the engine for
each ``local`` backend with ``spawn: true`` (model from the backend's ``model_path``,
``--model``, or the one ``make model`` fetched into
``~/.cache/prefixgate/models/SmolLM2-135M-Instruct``), waits for its ``/health``, then serves
the proxy with uvicorn (default 127.0.0.1:8080, or the policy's ``listen``). The engines are
stopped when the proxy exits. Each spawned engine gets the policy's
``engine`` flags (``--span-reuse on|off``, :mod:`prefixgate.config.engine_settings`).

uvicorn runs with the policy's ``limits`` (:func:`prefixgate.proxy.http.server.uvicorn_options`: header size
and deadline, keep-alive, concurrency). Listening on a non-loopback address requires proxy keys
(``auth``; :func:`prefixgate.proxy.http.auth.needs_keys`): without any, serve refuses to start (exit 2) and
says how to add one. Log messages are escaped (:class:`prefixgate.proxy.core.logsafe.SafeFormatter`).

``--workers N`` runs N proxy processes on one listening socket (uvicorn's multiprocess
supervisor; each worker builds its app with :func:`app_from_env` from the policy path handed over
in ``PREFIXGATE_POLICY``). They share one ledger file — SQLite WAL serialises their batched
transactions, so ``prefixgate report`` reads every worker's rows from one place — and, when the
policy sets ``ledger.redis_url``, one session memory. Without Redis each worker keeps its own
session memory (a session's requests may land on different workers: set ``redis_url`` for
rewrites that learn across requests). Engines are spawned once, by the parent.

One log format for everything serve prints (:data:`LOG_FORMAT`, uvicorn's own lines included:
it runs with ``log_config=None`` so its loggers reach the root handler); a spawned engine logs
warnings only (``--log-level debug`` shows its info lines too). Once the proxy answers
``/healthz``, a **ready banner** (:func:`ready_lines`): the proxy's URL as each SDK wants it,
the dashboard's URL, the report command. One access line per client request
(``prefixgate.access``: method, path, status, model, TTFT; never prompt text);
``--no-access-log`` turns it off.

A spawned engine listens on a random loopback port (:mod:`prefixgate.proxy.cli.engine_proc`),
which the served policy's backend ``base_url`` is set to (and handed to ``--workers`` processes
in ``PREFIXGATE_ENGINE_URLS``): an SDK pointed at the policy's 8081 by mistake finds nothing
there instead of an engine that answers without the proxy.

``engine --model DIR [--host] [--port 8081] [--device cpu] [extra engine flags]``: replaces
itself with ``python -m prefixgate.local_engine`` (same flags).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib import resources
from pathlib import Path

import typer

from prefixgate.config.backend_kinds import traits
from prefixgate.config.diagnose import diagnose
from prefixgate.config.loader import PolicyError, default_policy, load_policy, with_default_keys_file
from prefixgate.config.schema import Policy
from prefixgate.proxy.cli.engine_proc import EngineProcess, EngineStartError, engine_command
from prefixgate.proxy.cli.progress import step
from prefixgate.proxy.core import heap
from prefixgate.proxy.core.logsafe import SafeFormatter
from prefixgate.proxy.http.auth import KeyStore, needs_keys
from prefixgate.proxy.http.server import guarded_protocol, uvicorn_options

LOG_FORMAT = "%(asctime)s %(name)s %(message)s"
WORKER_HEALTHCHECK_S = 60
"""Seconds a ``--workers`` process may take to answer uvicorn's supervisor (its default, 5 s,
killed every worker of a busy 2-core machine while it was still importing and building the
app, and respawned it, forever: issue 25's scaling run)."""
POLICY_ENV = "PREFIXGATE_POLICY"
"""Policy file path handed to ``--workers`` processes ("" = the shipped default policy)."""
ENGINE_URLS_ENV = "PREFIXGATE_ENGINE_URLS"
"""JSON ``{backend: base_url}`` of the engines serve spawned, handed to ``--workers`` processes."""
LOG_LEVEL_ENV, ACCESS_ENV = "PREFIXGATE_LOG_LEVEL", "PREFIXGATE_ACCESS_LOG"
"""``--log-level`` and ``--access-log`` handed to ``--workers`` processes."""
log = logging.getLogger("prefixgate")


def with_engine_urls(pol: Policy, urls: dict[str, str]) -> Policy:
    """``pol`` with each named backend's ``base_url`` replaced (the spawned engines' ports)."""
    if not urls:
        return pol
    backends = {name: b.model_copy(update={"base_url": urls[name]}) if name in urls else b
                for name, b in pol.backends.items()}
    return pol.model_copy(update={"backends": backends})


def _policy_from_env() -> Policy:
    path = os.environ.get(POLICY_ENV, "")
    pol = with_default_keys_file(load_policy(Path(path)) if path else default_policy())
    return with_engine_urls(pol, json.loads(os.environ.get(ENGINE_URLS_ENV) or "{}"))


def app_from_env() -> object:
    """The proxy app for the policy named by ``$PREFIXGATE_POLICY`` (uvicorn factory for
    ``--workers``; each worker process calls it once). Raises PolicyError for a bad policy."""
    from prefixgate.proxy.app import build_app

    # a worker is a fresh interpreter: the parent's logging setup is not inherited
    _configure_logging(os.environ.get(LOG_LEVEL_ENV, "info"), os.environ.get(ACCESS_ENV) != "0")
    heap.configure()  # megabyte buffers mmapped, returned when freed (core.heap)
    app = build_app(_policy_from_env())
    app.state.freeze_startup = True  # startup objects out of every later full collection
    return app


def __getattr__(name: str) -> object:
    """``WorkerProtocol``: the guarded h11 protocol for ``$PREFIXGATE_POLICY``'s limits. uvicorn
    pickles its config into each worker, and a class made per policy does not pickle, so
    workers import it by name (``cli.serve:WorkerProtocol``) and build it there."""
    if name == "WorkerProtocol":
        return guarded_protocol(_policy_from_env().limits)
    raise AttributeError(name)


def _load(policy: Path | None) -> Policy:
    """The policy to serve, after the diagnosis ``prefixgate config check`` makes: every problem
    of the file in one run, in the same words (exit 2), then its warnings (an unset backend key)
    once, at start (issue 22, item 4). A policy that names no ``auth.keys_file`` reads the
    default keys file, the one ``prefixgate keys add`` without ``--policy`` writes (item 6)."""
    with resources.as_file(resources.files("prefixgate.config") / "default_policy.yaml") as shipped:
        path = policy if policy else shipped
        problems, warnings = diagnose(path)
    for where, msg in problems:
        typer.echo(f"{path}: {where or '<root>'}: {msg}", err=True)
    if problems:
        raise typer.Exit(2)
    for where, msg in warnings:
        typer.echo(f"{path}: warning: {where}: {msg}", err=True)
    try:
        return with_default_keys_file(load_policy(policy) if policy else default_policy())
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


def refuse_unauthenticated(pol: Policy, host: str, policy_path: Path | None) -> str | None:
    """Why serving ``pol`` on ``host`` must not start (an address other than loopback and no
    proxy key configured), or None when it may. The message says how to fix it."""
    if not needs_keys(host) or KeyStore(pol.auth).configured:
        return None
    where = f"--policy {policy_path} " if policy_path else ""
    return (f"refusing to listen on {host}: it is not a loopback address and the policy has no "
            "proxy keys, so anyone who can reach it would use your upstream API keys.\n"
            f"Add one with `prefixgate keys add {where}--name NAME` (clients then send it as "
            "'Authorization: Bearer <key>' or 'x-api-key: <key>'), or listen on 127.0.0.1.")


def said_keys(pol: Policy, policy_path: Path | None) -> str | None:
    """What ``serve`` says at start when keys are required: how many and from where, so a
    401 is never a surprise (the default keys file applies to any policy naming none); None
    when no key is required."""
    store = KeyStore(pol.auth)
    if not store.configured:
        return None
    inline = len(pol.auth.keys)
    where = [f"{inline} inline"] if inline else []
    if pol.auth.keys_file:
        where.append(f"{len(store.keys()) - inline} in {pol.auth.keys_file}")
    listing = f"prefixgate keys list --policy {policy_path}" if policy_path else "prefixgate keys list"
    return (f"proxy keys required ({', '.join(where)}): a model request without one gets 401 "
            f"(`{listing}` shows them)")


DEFAULT_MODEL_DIR = Path("~/.cache/prefixgate/models/SmolLM2-135M-Instruct")


def fetched_model() -> str | None:
    """The model ``make model`` fetches, when it is there (``config.json`` present)."""
    d = DEFAULT_MODEL_DIR.expanduser()
    return str(d) if (d / "config.json").is_file() else None


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _check_log_level(value: str) -> str:
    """``--log-level``: one of :data:`LOG_LEVELS` (case-insensitive), else a usage error."""
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def _configure_logging(level: str, access_log: bool = True) -> None:
    """One handler, one format (:data:`LOG_FORMAT`) for every logger, uvicorn's included; the
    access lines (``prefixgate.access``) at INFO, or off."""
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    # uvicorn's "trace" is below DEBUG; the standard library has no such level
    logging.basicConfig(level="DEBUG" if level == "trace" else level.upper(), handlers=[handler])
    logging.getLogger("prefixgate.access").setLevel(logging.INFO if access_log else logging.WARNING)
    if level not in ("debug", "trace"):  # httpx says INFO for every health poll: noise
        logging.getLogger("httpx").setLevel(logging.WARNING)


def ready_lines(host: str, port: int, policy_path: Path | None,
                engines: dict[str, str]) -> list[str]:
    """The ready banner: the proxy's URL as the OpenAI SDK (``/v1``) and the Anthropic SDK (no
    ``/v1``) want it, the dashboard, the report command, and the spawned engines' internal
    addresses (said as not for SDKs)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    origin = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
    report = f"prefixgate report --policy {policy_path}" if policy_path else "prefixgate report"
    lines = [f"prefixgate ready: base_url {origin}/v1 (OpenAI SDK, LangChain) or {origin} "
             "(Anthropic SDK)",
             f"  dashboard {origin}/dashboard · savings and cache breaks: `{report}`"]
    lines += [f"  engine of backend {name!r} at {url} (the proxy's own: point SDKs at the proxy)"
              for name, url in sorted(engines.items())]
    return lines


def _say_when_ready(host: str, port: int, lines: list[str], timeout_s: float = 600.0) -> None:
    """Log ``lines`` once the proxy at ``host:port`` answers ``/healthz`` (any status: a
    degraded proxy is still up), from a daemon thread; nothing if it never does."""
    import httpx

    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    url = f"http://[{shown}]:{port}/healthz" if ":" in shown else f"http://{shown}:{port}/healthz"

    def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1.0)
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            for line in lines:
                log.info("%s", line)
            return

    threading.Thread(target=wait, name="prefixgate-ready", daemon=True).start()


class _Terminated(BaseException):
    """SIGTERM / SIGHUP arrived: unwinds serve like KeyboardInterrupt (no ``except Exception``
    catches it). ``signum``: the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _unwind_on(signum: int, _frame: object) -> None:
    raise _Terminated(signum)


@contextmanager
def _termination_unwinds() -> Iterator[None]:
    """While serve runs, SIGTERM / SIGHUP unwind it (the ExitStack stops the engines it
    spawned), then the process dies by that signal as before (status -15 to a parent, 143 to a
    shell; systemd counts it a clean stop). Without it the default action killed serve at once
    and left a spawned engine running: uvicorn handles the signal for its own graceful shutdown,
    then restores the handlers and raises the signal again (uvicorn 0.29+), and SIGTERM's default
    action does not unwind Python (SIGINT's KeyboardInterrupt does). ``kill PID``, systemd and
    ``docker stop`` send SIGTERM; a closed terminal sends SIGHUP."""
    caught = (signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, _unwind_on) for sig in caught}
    received: int | None = None
    try:
        yield
    except _Terminated as t:
        received = t.signum
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if received is not None:
        signal.raise_signal(received)


def serve(
    policy: Path | None = typer.Option(None, "--policy", help="policy YAML (default: shipped)"),
    model: Path | None = typer.Option(None, "--model", help="model dir for spawned local engines"),
    host: str | None = typer.Option(None, "--host", help="listen address (default: policy)"),
    port: int | None = typer.Option(None, "--port", min=1, max=65535,
                                    help="listen port (default: policy, 8080)"),
    log_level: str = typer.Option("info", "--log-level", callback=_check_log_level,
                                  help="one of " + ", ".join(LOG_LEVELS)),
    workers: int = typer.Option(1, "--workers", min=1, help="proxy processes (one ledger)"),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log",
                                    help="one line per client request (method, path, status, "
                                         "model, TTFT)"),
) -> None:
    """Start the local engine(s) the policy spawns, then the proxy (--workers processes)."""
    import uvicorn

    from prefixgate.proxy.app import build_app

    _configure_logging(log_level, access_log)
    pol = _load(policy)
    listen_host = host or pol.listen.host
    refusal = refuse_unauthenticated(pol, listen_host, policy)
    if refusal:
        typer.echo(refusal, err=True)
        raise typer.Exit(2)
    keys_note = said_keys(pol, policy)
    if keys_note:
        typer.echo(keys_note, err=True)
    engines: dict[str, str] = {}  # backend -> where its spawned (or reused) engine answers
    with _termination_unwinds(), ExitStack() as stack:
        for name, b in pol.backends.items():
            if not traits(b.kind).spawnable or not b.spawn:
                continue
            model_dir = b.model_path or (str(model) if model else None) or fetched_model()
            if not model_dir:
                typer.echo(f"backend {name!r} spawns a local engine: give --model DIR or set "
                           f"backends.{name}.model_path (or fetch the default model with "
                           f"`make model`, into {DEFAULT_MODEL_DIR})", err=True)
                raise typer.Exit(2)
            quiet = [] if log_level in ("debug", "trace") else ["--log-level", "warning"]
            try:
                with step(f"starting the local engine of backend {name!r} ({model_dir}; "
                          "model load and warm-up, 30-60 s on a CPU)"):
                    eng = stack.enter_context(EngineProcess(
                        b, os.path.expanduser(model_dir),
                        extra=[*quiet, *pol.engine.engine_flags()],
                        env={"HF_HUB_DISABLE_PROGRESS_BARS": "1"} if quiet else {}))
            except EngineStartError as e:
                typer.echo(f"backend {name!r}: {e}", err=True)
                raise typer.Exit(1) from None
            engines[name] = getattr(eng, "base_url", "") or b.base_url
        pol = with_engine_urls(pol, engines)
        listen_port = port or pol.listen.port
        options = {"host": listen_host, "port": listen_port, "log_level": log_level,
                   "timeout_graceful_shutdown": 5, "access_log": False, "log_config": None,
                   **uvicorn_options(pol.limits)}
        _say_when_ready(listen_host, listen_port, ready_lines(listen_host, listen_port, policy,
                                                              engines))
        if workers == 1:
            heap.configure()  # megabyte buffers mmapped, returned when freed (core.heap)
            app = build_app(pol)
            app.state.freeze_startup = True  # startup objects out of every later full collection
            uvicorn.run(app, **options)
            return
        os.environ[ENGINE_URLS_ENV] = json.dumps(engines)
        os.environ[LOG_LEVEL_ENV], os.environ[ACCESS_ENV] = log_level, "1" if access_log else "0"
        os.environ[POLICY_ENV] = str(policy.resolve()) if policy else ""
        options["http"] = f"{__name__}:WorkerProtocol"
        options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_S
        uvicorn.run(f"{__name__}:app_from_env", factory=True, workers=workers, **options)


def engine(
    ctx: typer.Context,
    model: Path = typer.Option(..., "--model", help="HF model directory"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8081, "--port"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Run the local engine alone (python -m prefixgate.local_engine); extra flags pass through."""
    argv = engine_command(str(model), host, port, device, list(ctx.args))
    sys.stdout.flush()
    os.execv(argv[0], argv)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``engine``."""
    app.command("serve")(serve)
    app.command("engine", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})(engine)
