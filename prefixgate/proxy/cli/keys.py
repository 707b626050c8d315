"""``prefixgate keys add / list / remove``: proxy keys, stored as hashes (see
:mod:`prefixgate.proxy.http.auth`).

Without ``--policy`` every command works on the **default keys file**
(:func:`prefixgate.config.loader.default_keys_file`: ``$PREFIXGATE_KEYS_FILE``, else
``~/.config/prefixgate/keys.yaml``), which ``prefixgate serve`` reads for any policy that names no
``auth.keys_file`` — the shipped policy included — so ``prefixgate keys add --name ci`` then
``prefixgate serve --host 0.0.0.0`` works with no policy file written (issue 22, item 6).

``keys add [--policy FILE] [--name N] [--rpm R] [--tpm T]`` makes a key, prints it ONCE on stdout
(only the key, so ``KEY=$(prefixgate keys add ...)`` works; the id and file go to stderr) and
stores its hash in the keys file the policy names (``auth.keys_file``). A policy with no
``auth`` section gets one appended, ``auth: {keys_file: <policy name>.keys.yaml}`` next to the
policy file (its keys stay with it, apart from other policies'); the rest of the policy file,
comments included, is left as it was. A policy whose ``auth`` section has inline keys but no
``keys_file`` is not rewritten: the command says what to add (``serve`` reads the default keys
file for it, so ``keys add`` without ``--policy`` works too).

``keys list [--policy FILE]``: id, name, limits, creation date and where each key is stored (never
a hash or a key). ``keys remove [--policy FILE] ID_OR_NAME``: drops a key from the keys file
(inline keys are the policy's to edit). With ``--policy``, the keys file is the one ``serve``
reads for that policy: its ``auth.keys_file``, else the default one. A running ``prefixgate
serve`` picks changes up within a second (the keys file is re-read when it changes); removing the
last key leaves it refusing every request, never open (:mod:`prefixgate.proxy.http.keystore`).

Concurrent commands (issue 20 High 3: 8 parallel ``keys add`` kept 4 keys): each read-modify-write
of the keys file runs under an exclusive lock on ``<keys file>.lock``, and appending the ``auth``
section to a policy under one on ``<policy>.lock`` (:func:`prefixgate.proxy.http.keystore.locked`);
the file itself is replaced atomically, so a running proxy never reads it half-written.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import typer
import yaml

from prefixgate.config.loader import (
    PolicyError,
    default_keys_file,
    load_keys_file,
    load_policy,
    save_keys_file,
    with_default_keys_file,
)
from prefixgate.config.schema import Policy, ProxyKey
from prefixgate.proxy.http.auth import hash_key, new_key, new_key_id
from prefixgate.proxy.http.keystore import locked

keys_app = typer.Typer(help="Proxy keys (stored as hashes): add, list, remove.",
                       no_args_is_help=True)
POLICY_OPT = typer.Option(None, "--policy",
                          help="policy YAML whose keys to manage (default: the default keys file, "
                               "~/.config/prefixgate/keys.yaml, which serve reads for a policy "
                               "naming no auth.keys_file)")


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(msg, err=True)
    return typer.Exit(code)


def _load(path: Path) -> Policy:
    try:
        return load_policy(path)
    except PolicyError as e:
        raise _fail(str(e)) from None


def _read(kf: Path) -> list[ProxyKey]:
    """The keys in ``kf`` (none when it does not exist); exit 2 when it cannot be read: a file
    the command cannot read is never overwritten."""
    try:
        return load_keys_file(kf)
    except PolicyError as e:
        raise _fail(str(e)) from None


def _has_auth_section(path: Path) -> bool:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and "auth" in data


def keys_file_for(policy_path: Path) -> Path:
    """The keys file of the policy at ``policy_path``, naming one in the policy first when it
    names none (see module docstring; under the policy's lock). Raises typer.Exit(2) when it
    cannot."""
    with locked(policy_path):
        return _keys_file_for(policy_path)


def _keys_file_for(policy_path: Path) -> Path:
    pol = _load(policy_path)
    if pol.auth.keys_file:
        return Path(pol.auth.keys_file)
    if _has_auth_section(policy_path):
        raise _fail(f"{policy_path}: the auth section names no keys_file; add "
                    f"`keys_file: {policy_path.stem}.keys.yaml` under auth and run this again, "
                    "or run `prefixgate keys add` without --policy: serve reads the default keys "
                    f"file ({default_keys_file()}) for a policy that names none")
    name = f"{policy_path.stem}.keys.yaml"
    original = policy_path.read_text(encoding="utf-8")
    sep = "" if original.endswith("\n") or not original else "\n"
    policy_path.write_text(original + sep + "auth:\n  # proxy keys (hashes only), managed by "
                           f"`prefixgate keys`\n  keys_file: {name}\n", encoding="utf-8")
    try:
        pol = load_policy(policy_path)
    except PolicyError as e:  # never leave a policy that no longer loads
        policy_path.write_text(original, encoding="utf-8")
        raise _fail(str(e)) from None
    typer.echo(f"policy {policy_path}: added auth.keys_file: {name}", err=True)
    return Path(pol.auth.keys_file or name)


def _served(policy: Path | None) -> tuple[list[ProxyKey], Path]:
    """The policy's inline keys and the keys file ``serve`` reads for it (the default keys file
    when ``policy`` is None or names none)."""
    if policy is None:
        return [], default_keys_file()
    pol = with_default_keys_file(_load(policy))
    return pol.auth.keys, Path(pol.auth.keys_file or default_keys_file())


@keys_app.command("add")
def add(policy: Path | None = POLICY_OPT,
        name: str = typer.Option("", "--name", help="a label for the key (who uses it)"),
        rpm: int | None = typer.Option(None, "--rpm", min=1, help="requests per minute"),
        tpm: int | None = typer.Option(None, "--tpm", min=1,
                                       help="tokens (prompt + output) per minute")) -> None:
    """Make a key, print it once, store its hash."""
    if policy is None:
        kf, inline = default_keys_file(), []
    else:
        kf = keys_file_for(policy)
        inline = _load(policy).auth.keys
    key = new_key()
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with locked(kf):  # read-modify-write: no other `keys` command in between
        existing = _read(kf)
        taken = {k.id for k in existing} | {k.id for k in inline}
        kid = new_key_id()
        while kid in taken:
            kid = new_key_id()
        entry = ProxyKey(id=kid, name=name, hash=hash_key(key), rpm=rpm, tpm=tpm, created=created)
        save_keys_file(kf, [*existing, entry])
    typer.echo(f"added key {kid}{f' ({name})' if name else ''} to {kf}; it is shown only "
               "once, here:", err=True)
    if policy is None:
        typer.echo("(the default keys file: `prefixgate serve` reads it for any policy that "
                   "names no auth.keys_file, the shipped one included)", err=True)
    typer.echo(key)


@keys_app.command("list")
def list_keys(policy: Path | None = POLICY_OPT) -> None:
    """One line per key: id, name, rpm, tpm, created, where stored."""
    inline, kf = _served(policy)
    rows = [(k, "policy") for k in inline] + [(k, str(kf)) for k in _read(kf)]
    if not rows:
        typer.echo("no proxy keys: the proxy serves anyone who reaches it (loopback only)")
        return
    typer.echo(f"{'id':<16} {'name':<20} {'rpm':>8} {'tpm':>10}  {'created':<20} stored in")
    for k, where in rows:
        typer.echo(f"{k.id:<16} {k.name[:20]:<20} {k.rpm or '-':>8} {k.tpm or '-':>10}  "
                   f"{k.created or '-':<20} {where}")


@keys_app.command("remove")
def remove(ident: str = typer.Argument(..., metavar="ID_OR_NAME"),
           policy: Path | None = POLICY_OPT) -> None:
    """Remove the key with this id (or, if no id matches, this unique name)."""
    inline, kf = _served(policy)
    if any(ident in (k.id, k.name) for k in inline):
        raise _fail(f"key {ident!r} is written inline in {policy} (auth.keys): remove it there")
    with locked(kf):
        keys = _read(kf)
        hit = [k for k in keys if k.id == ident] or [k for k in keys if k.name == ident]
        if not hit:
            raise _fail(f"no key {ident!r} in {kf}", 1)
        if len(hit) > 1:
            raise _fail(f"{len(hit)} keys are named {ident!r}; remove one by id: "
                        f"{', '.join(k.id for k in hit)}")
        rest = [k for k in keys if k.id != hit[0].id]
        save_keys_file(kf, rest)
    typer.echo(f"removed key {hit[0].id} from {kf}", err=True)
    if not rest and not inline:
        typer.echo("that was the last key: a running proxy now refuses every model request "
                   "(401) until a key is added; it does not go back to serving without keys",
                   err=True)


def register(app: typer.Typer) -> None:
    """Add the ``keys`` command group."""
    app.add_typer(keys_app, name="keys")
