"""What the SASL tests share: users and passwords, the files kipside reads, client settings.

Every password here is unique text, so a test can search kipside's output for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaykit.sasl import SaslRelay
from relaykit.tansu import tansu_behind
from testkit.kipside import Kipside, start_kipside

from .clients import python_client_names

# Who clients are (to the relay in passthrough, to kipside in termination).
CLIENT_PASSWORDS = {
    "alice": "alice-pw-Zq81",
    "bob": "bob-pw-Xr27",
    "carol": "carol-pw-Wk55",
    "dave": "dave-pw-Tn38",
}
# Who kipside is to the relay in termination mode, per principal (carol has no login).
UPSTREAM_PASSWORDS = {
    "alice-up": "alice-up-pw-Jd40",
    "bob-up": "bob-up-pw-Hs63",
    "dave-up": "dave-up-pw-Pc19",
}
KIPSIDE_PASSWORD = "kipside-pw-Lm92"  # kipside's own login (node discovery)
BOB_ENV = "KIPSIDE_TEST_BOB_UP_PASSWORD"
SECRETS = (*CLIENT_PASSWORDS.values(), *UPSTREAM_PASSWORDS.values(), KIPSIDE_PASSWORD)


@dataclass
class SaslSetup:
    relay: SaslRelay
    kipside: Kipside

    @property
    def bootstrap(self) -> str:
        return self.kipside.bootstrap


def upstream_file(folder: Path, *, termination: bool) -> Path:
    """The --sasl-upstream file: kipside's own login, and in termination one per principal
    (alice's password in a file, bob's in an environment variable)."""
    (folder / "kipside.pw").write_text(KIPSIDE_PASSWORD + "\n")
    for user in ("alice-up", "dave-up"):
        (folder / f"{user}.pw").write_text(UPSTREAM_PASSWORDS[user] + "\n")
    for name in ("kipside.pw", "alice-up.pw", "dave-up.pw"):
        (folder / name).chmod(0o600)
    text = (
        "discovery: User:kipside\n"
        "principals:\n"
        "  User:kipside: {mechanism: SCRAM-SHA-512, username: kipside, password_file: kipside.pw}\n"
    )
    if termination:
        text += (
            "  User:alice: {mechanism: SCRAM-SHA-256, username: alice-up, "
            "password_file: alice-up.pw}\n"
            f"  User:bob: {{mechanism: PLAIN, username: bob-up, password_env: {BOB_ENV}}}\n"
            "  User:dave: {mechanism: PLAIN, username: dave-up, password_file: dave-up.pw}\n"
        )
    path = folder / "upstream.yaml"
    path.write_text(text)
    return path


def credentials_file(folder: Path) -> Path:
    """The --sasl-credentials file, written by `kipside credentials add` as a user would."""
    import subprocess

    from testkit.kipside import KIPSIDE_BIN

    path = folder / "credentials.yaml"
    for user, password in CLIENT_PASSWORDS.items():
        subprocess.run(
            [str(KIPSIDE_BIN), "credentials", "add", str(path), user],
            input=password + "\n",
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )
    return path


@contextmanager
def sasl_kipside(
    folder: Path, *, legacy: bool = False, termination: bool = False, extra: tuple[str, ...] = ()
) -> Iterator[SaslSetup]:
    """A SaslRelay in front of a fresh Tansu, and `kipside serve` in front of the relay."""
    users = {"kipside": KIPSIDE_PASSWORD}
    users.update(UPSTREAM_PASSWORDS if termination else CLIENT_PASSWORDS)
    relay = SaslRelay(users, legacy=legacy)
    args = ["--sasl-upstream", str(upstream_file(folder, termination=termination)), *extra]
    if termination:
        args += ["--sasl-credentials", str(credentials_file(folder))]
    os.environ[BOB_ENV] = UPSTREAM_PASSWORDS["bob-up"]
    with tansu_behind(relay):
        kipside = start_kipside(relay, folder / "kipside", extra_args=args)
        try:
            yield SaslSetup(relay, kipside)
        finally:
            code = kipside.stop()
            assert code == 0, f"kipside exited {code}"
            assert relay.problems() == []


def ck_sasl(mechanism: str, user: str, password: str | None = None) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": CLIENT_PASSWORDS[user] if password is None else password,
    }


def py_sasl(mechanism: str, user: str, password: str | None = None) -> dict[str, Any]:
    """kafka-python's and aiokafka's names for the same settings."""
    return python_client_names(ck_sasl(mechanism, user, password))
