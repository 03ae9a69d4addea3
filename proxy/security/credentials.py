"""The two SASL files kipside reads: who may log in to kipside, and who kipside is to the brokers.

The credentials file (`--sasl-credentials`, written by `kipside credentials add`) holds, per
user and SCRAM mechanism, only the salted credential a SCRAM server needs (salt, iterations,
StoredKey, ServerKey): never a password. PLAIN logins are checked against the same entries.

The upstream file (`--sasl-upstream`) says, per client principal, which mechanism and user name
kipside authenticates to the brokers with, and where that password is: a file
(`password_file`, relative to the upstream file) or an environment variable (`password_env`).
Passwords are never written in the upstream file itself, so the file can be shown, diffed and
checked in. A password is read when a connection is dialled (a rotated secret takes effect on
the next connection) and kept only in a `Secret`, whose repr and str hide it.

Nothing here logs a secret or puts one in an exception message.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kipside.protocol import (
    SASL_MECHANISMS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    ScramCredential,
)
from kipside.proxy.core.identity import Principal

log = logging.getLogger("kipside.sasl")

_HEADER = (
    "# kipside SASL credentials: salted SCRAM keys only, never a password.\n"
    "# Written by `kipside credentials add FILE USER`; see docs/security.md.\n"
)


class CredentialsError(ValueError):
    """A SASL file is missing or wrong; the message names the file and what to change."""


class Secret:
    """A password held in memory: never shown by repr or str."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CredentialsError(f"{path}: no such {what}; check the path") from None
    except OSError as exc:
        raise CredentialsError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise CredentialsError(f"{where}: not valid YAML; fix the {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CredentialsError(f"{path}: expected a mapping at the top of the {what}")
    return data


def _warn_if_readable_by_others(path: Path, what: str) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "%s %s is readable by other users (mode %o); run chmod 600 %s",
            what,
            path,
            stat.S_IMODE(mode),
            path,
        )


# The credentials file (kipside as a SASL server) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class CredentialStore:
    """The users who may authenticate to kipside, as salted SCRAM credentials."""

    source: str
    users: Mapping[str, Mapping[str, ScramCredential]] = field(repr=False)

    def lookup(self, username: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(username, {}).get(mechanism)

    def describe(self) -> dict[str, list[str]]:
        """User -> mechanisms: what may be shown (no salt, no key)."""
        return {user: sorted(entries) for user, entries in self.users.items()}


def _b64(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise CredentialsError(f"{where}: expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsError(f"{where}: not base64") from None


def _entry(entry: object, where: str, *, expected: str, instead: str) -> dict[Any, Any]:
    """An entry of either file as a mapping. Neither file may hold a password: `instead` says
    where it belongs."""
    if not isinstance(entry, dict):
        raise CredentialsError(f"{where}: expected {expected}")
    if "password" in entry:
        raise CredentialsError(f"{where}: a password is written in the file; {instead}")
    return entry


def _credential(mechanism: str, entry: object, where: str) -> ScramCredential:
    if mechanism not in SCRAM_MECHANISMS:
        raise CredentialsError(
            f"{where}: unknown mechanism; a credentials file holds {', '.join(SCRAM_MECHANISMS)} "
            "(PLAIN logins are checked against them)"
        )
    entry = _entry(
        entry,
        where,
        expected="salt, iterations, stored_key, server_key",
        instead="a credentials file holds salted keys only: remove it and write the entry with "
        "`kipside credentials add`",
    )
    iterations = entry.get("iterations")
    if not isinstance(iterations, int) or not (
        SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS
    ):
        raise CredentialsError(
            f"{where}.iterations: expected an integer between {SCRAM_MIN_ITERATIONS} and "
            f"{SCRAM_MAX_ITERATIONS}"
        )
    return ScramCredential(
        mechanism,
        _b64(entry.get("salt"), f"{where}.salt"),
        iterations,
        _b64(entry.get("stored_key"), f"{where}.stored_key"),
        _b64(entry.get("server_key"), f"{where}.server_key"),
    )


def load_credentials(path: str | os.PathLike[str]) -> CredentialStore:
    """Read and check a credentials file; CredentialsError says what is wrong where."""
    source = Path(path)
    data = _read_yaml(source, "credentials file")
    unknown = set(data) - {"users"}
    if unknown:
        raise CredentialsError(f"{source}: unknown key {sorted(unknown)[0]!r}; expected 'users'")
    users_data = data.get("users") or {}
    if not isinstance(users_data, dict):
        raise CredentialsError(f"{source}: users: expected a mapping of user name to entries")
    users: dict[str, dict[str, ScramCredential]] = {}
    for user, entries in users_data.items():
        where = f"{source}: users.{user}"
        if not isinstance(entries, dict) or not entries:
            raise CredentialsError(f"{where}: expected SCRAM-SHA-256 and/or SCRAM-SHA-512 entries")
        users[str(user)] = {
            str(m): _credential(str(m), entry, f"{where}.{m}") for m, entry in entries.items()
        }
    _warn_if_readable_by_others(source, "credentials file")
    return CredentialStore(str(source), users)


def _credential_entry(credential: ScramCredential) -> dict[str, object]:
    return {
        "salt": base64.b64encode(credential.salt).decode(),
        "iterations": credential.iterations,
        "stored_key": base64.b64encode(credential.stored_key).decode(),
        "server_key": base64.b64encode(credential.server_key).decode(),
    }


def write_credentials(path: str | os.PathLike[str], store: CredentialStore) -> None:
    """Write the file atomically (a sibling temporary file, then rename), mode 600."""
    target = Path(path)
    users = {
        user: {m: _credential_entry(c) for m, c in sorted(entries.items())}
        for user, entries in sorted(store.users.items())
    }
    text = _HEADER + yaml.safe_dump({"users": users}, sort_keys=False)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def with_user(
    store: CredentialStore, username: str, credentials: list[ScramCredential]
) -> CredentialStore:
    """The store with `username`'s entries for these mechanisms replaced."""
    users = {user: dict(entries) for user, entries in store.users.items()}
    entries = users.setdefault(username, {})
    for credential in credentials:
        entries[credential.mechanism] = credential
    return CredentialStore(store.source, users)


# The upstream file (kipside as a SASL client) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class UpstreamLogin:
    """How kipside authenticates to the brokers for one principal."""

    principal: str
    mechanism: str
    username: str
    password_file: Path | None = None
    password_env: str | None = None

    def where(self) -> str:
        """Where the password is kept (for messages; never the password)."""
        if self.password_file is not None:
            return f"password_file {self.password_file}"
        return f"password_env {self.password_env}"

    def password(self) -> Secret:
        """Read the password now; CredentialsError if it is not there."""
        if self.password_file is not None:
            try:
                text = self.password_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise CredentialsError(
                    f"upstream credentials of {self.principal}: cannot read "
                    f"{self.password_file} ({exc.strerror or exc})"
                ) from None
            return Secret(text.rstrip("\r\n"))
        assert self.password_env is not None
        value = os.environ.get(self.password_env)
        if value is None:
            raise CredentialsError(
                f"upstream credentials of {self.principal}: environment variable "
                f"{self.password_env} is not set"
            )
        return Secret(value)


@dataclass(frozen=True, slots=True)
class UpstreamLogins:
    """Per principal, how kipside authenticates to the brokers (the --sasl-upstream file)."""

    source: str
    logins: Mapping[str, UpstreamLogin]
    discovery: str | None = None
    """The principal whose login kipside uses for its own requests (node discovery)."""

    def for_principal(self, principal: Principal) -> UpstreamLogin | None:
        return self.logins.get(principal.name)

    def describe(self) -> dict[str, object]:
        """What may be shown: mechanisms, user names and where secrets live, never a secret."""
        return {
            "discovery": self.discovery,
            "principals": {
                name: {"mechanism": login.mechanism, "username": login.username}
                for name, login in self.logins.items()
            },
        }


_LOGIN_KEYS = ("mechanism", "username", "password_file", "password_env")


def _login(principal: str, entry: object, folder: Path, where: str) -> UpstreamLogin:
    entry = _entry(
        entry,
        where,
        expected=f"a mapping with keys {', '.join(_LOGIN_KEYS)}",
        instead="put it in a file (password_file) or an environment variable (password_env) "
        "and name that here",
    )
    unknown = sorted(set(entry) - set(_LOGIN_KEYS))
    if unknown:
        raise CredentialsError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys are {', '.join(_LOGIN_KEYS)}"
        )
    mechanism = entry.get("mechanism")
    if mechanism not in SASL_MECHANISMS:
        raise CredentialsError(f"{where}.mechanism: expected one of {', '.join(SASL_MECHANISMS)}")
    username = entry.get("username")
    if not isinstance(username, str) or not username:
        raise CredentialsError(f"{where}.username: expected the user name kipside logs in as")
    file, env = entry.get("password_file"), entry.get("password_env")
    if (file is None) == (env is None):
        raise CredentialsError(f"{where}: give exactly one of password_file or password_env")
    if not isinstance(file if file is not None else env, str):
        raise CredentialsError(f"{where}: password_file / password_env must be text")
    path = None if file is None else (folder / file)
    return UpstreamLogin(principal, str(mechanism), username, path, env)


def load_upstream_logins(path: str | os.PathLike[str]) -> UpstreamLogins:
    """Read and check an upstream file, and each password it names (read once, to fail at
    startup rather than on the first connection)."""
    source = Path(path)
    data = _read_yaml(source, "upstream credentials file")
    unknown = sorted(set(data) - {"principals", "discovery"})
    if unknown:
        raise CredentialsError(
            f"{source}: unknown key {unknown[0]!r}; expected 'principals' and 'discovery'"
        )
    entries = data.get("principals") or {}
    if not isinstance(entries, dict):
        raise CredentialsError(f"{source}: principals: expected a mapping of principal to login")
    logins: dict[str, UpstreamLogin] = {}
    for name, entry in entries.items():
        where = f"{source}: principals.{name}"
        if not isinstance(name, str) or not name.startswith("User:") or name == "User:":
            raise CredentialsError(f"{where}: a principal is written User:NAME")
        login = _login(name, entry, source.parent, where)
        login.password()  # fails now if it is missing
        if login.password_file is not None:
            _warn_if_readable_by_others(login.password_file, f"password file of {name}")
        logins[name] = login
    discovery = data.get("discovery")
    if discovery is not None and discovery not in logins:
        raise CredentialsError(
            f"{source}: discovery: {discovery!r} has no entry under principals; name one of them"
        )
    return UpstreamLogins(str(source), logins, discovery)
