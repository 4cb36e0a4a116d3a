"""CURVE keys for a federation: who the server is, and which hosts may join.

``fedsim keys DIR --hosts N --clients C`` writes, in ZeroMQ's certificate
format (``zmq.auth``):

* ``server.key`` (public) and ``server.key_secret``;
* ``host-<i>.key`` and ``host-<i>.key_secret`` for each client host;
* ``allowed.toml``: the allow-list, one ``[[host]]`` per host with its name,
  public key and the client ids it may speak for.

The server needs ``server.key_secret`` and ``allowed.toml``; client host
``i`` needs ``host-<i>.key_secret`` and ``server.key``. A host's identity is
its key: the server learns a connection's host name from the CURVE
handshake (the allow-list entry of the key), never from the connection.
Secret files are written mode 0600.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from fedsim.errors import DeployError
from fedsim.scenario.ids import format_ids, parse_ids, split_ids
from fedsim.wire.curve import ClientKeys, ServerKeys

__all__ = ["AllowedHost", "KeysError", "load_allowed", "load_client_keys", "load_server_keys",
           "make_keys"]

ALLOWED = "allowed.toml"


class KeysError(DeployError):
    """Keys that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class AllowedHost:
    """One allow-list entry: a host's name, public key and client ids."""

    name: str
    public: bytes
    ids: tuple[int, ...]


def make_keys(directory: str | Path, hosts: int, num_clients: int,
              ranges: list[str] | None = None) -> list[AllowedHost]:
    """Write the server's and ``hosts`` hosts' key pairs and the allow-list.

    ``ranges`` gives each host's client ids (default: ``num_clients`` split
    into contiguous, even ranges). Existing key files are never overwritten.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ranges = ranges or split_ids(num_clients, hosts)
    if len(ranges) != hosts:
        raise KeysError(f"{hosts} hosts but {len(ranges)} id ranges")
    names = ["server", *(f"host-{i}" for i in range(hosts))]
    clash = [n for n in names if (d / f"{n}.key_secret").exists()]
    if clash or (d / ALLOWED).exists():
        raise KeysError(f"{d} already holds keys ({', '.join(clash) or ALLOWED}); "
                        "use an empty directory")
    seen: set[int] = set()
    entries = []
    for i, text in enumerate(ranges):
        ids = parse_ids(text, num_clients)
        if seen & set(ids):
            raise KeysError(f"host-{i}'s ids {text} overlap another host's")
        seen |= set(ids)
        entries.append((f"host-{i}", ids))
    old = os.umask(0o077)
    try:
        zmq.auth.create_certificates(d, "server")
        allowed = []
        lines = ["# Client hosts allowed to join, and the client ids each may speak for.",
                 "# Written by `fedsim keys`; edit to revoke a host (delete its entry).", ""]
        for name, ids in entries:
            public, _ = zmq.auth.create_certificates(d, name)
            key, _ = zmq.auth.load_certificate(public)
            allowed.append(AllowedHost(name, key, tuple(ids)))
            lines += ["[[host]]", f'name = "{name}"', f'public_key = "{key.decode()}"',
                      f'ids = "{format_ids(ids)}"', ""]
        (d / ALLOWED).write_text("\n".join(lines))
    finally:
        os.umask(old)
    for p in d.glob("*.key"):
        p.chmod(0o644)
    return allowed


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise KeysError(f"{path} not found (make keys with `fedsim keys DIR`)")
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise KeysError(f"{path}: not a ZeroMQ certificate ({exc})") from None
    if secret and sec is None:
        raise KeysError(f"{path}: holds no secret key")
    return public, sec


def load_allowed(directory: str | Path, num_clients: int | None = None) -> list[AllowedHost]:
    """The allow-list in ``DIR/allowed.toml``; KeysError naming a bad entry."""
    path = Path(directory) / ALLOWED
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise KeysError(f"{path} not found (make keys with `fedsim keys DIR`)") from None
    except tomllib.TOMLDecodeError as exc:
        raise KeysError(f"{path}: {exc}") from None
    out: list[AllowedHost] = []
    owners: dict[int, str] = {}
    for i, entry in enumerate(raw.get("host", [])):
        where = f"{path}: host[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "public_key", "ids"}:
            raise KeysError(f"{where}: want exactly name, public_key and ids")
        key = str(entry["public_key"]).encode()
        try:
            if len(zmq.utils.z85.decode(key)) != 32:
                raise ValueError
        except (ValueError, TypeError):
            raise KeysError(f"{where}: public_key is not a 40-character Z85 CURVE key") from None
        try:
            ids = parse_ids(str(entry["ids"]), num_clients)
        except ValueError as exc:
            raise KeysError(f"{where}: ids: {exc}") from None
        taken = [c for c in ids if c in owners]
        if taken:
            raise KeysError(f"{where}: client {taken[0]} is also {owners[taken[0]]}'s")
        owners.update(dict.fromkeys(ids, str(entry["name"])))
        out.append(AllowedHost(str(entry["name"]), key, tuple(ids)))
    names = [h.name for h in out]
    if len(set(names)) != len(names) or len({h.public for h in out}) != len(out):
        raise KeysError(f"{path}: a host name or key is listed twice")
    if not out:
        raise KeysError(f"{path}: no [[host]] entries: no host could join")
    return out


def load_server_keys(directory: str | Path, num_clients: int | None = None
                     ) -> tuple[ServerKeys, list[AllowedHost]]:
    """The server's key pair and allow-list from a ``fedsim keys`` directory."""
    d = Path(directory)
    public, secret = _load(d / "server.key_secret", secret=True)
    allowed = load_allowed(d, num_clients)
    assert secret is not None
    return ServerKeys(public, secret, {h.public: h.name for h in allowed}), allowed


def load_client_keys(directory: str | Path, name: str) -> ClientKeys:
    """Host ``name``'s key pair and the server's public key."""
    d = Path(directory)
    public, secret = _load(d / f"{name}.key_secret", secret=True)
    server, _ = _load(d / "server.key", secret=False)
    assert secret is not None
    return ClientKeys(public, secret, server)
