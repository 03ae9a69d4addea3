"""Static checks of the container image recipe and the deployment guide (no Docker needed).

The Dockerfile is read instruction by instruction: a non-root numeric USER, a base image pinned
to an exact tag, exec-form ENTRYPOINT and HEALTHCHECK, and COPY sources that .dockerignore does
not exclude. The HEALTHCHECK command itself is run against a small local HTTP server. Every YAML
block in docs/deploy.md must parse, and its rule file must be a valid kipside rule file.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kipside.rules import parse_rules

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY_DOC = REPO / "docs" / "deploy.md"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    result = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def only(keyword: str) -> str:
    found = [rest for kw, rest in instructions() if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def test_base_image_is_pinned_python_311_slim() -> None:
    image = only("FROM").split()[0]
    name, _, tag = image.partition(":")
    assert name == "python"
    assert re.fullmatch(r"3\.11\.\d+-slim(-[a-z]+)?", tag), f"not an exact 3.11 slim tag: {tag!r}"


def test_runs_as_numeric_non_root_user() -> None:
    user = [rest for kw, rest in instructions() if kw == "USER"]
    assert user, "no USER instruction: the image would run as root"
    uid, _, gid = user[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user[-1]!r}: use a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The user exists in the image with that uid.
    assert f"--uid {uid}" in " ".join(rest for kw, rest in instructions() if kw == "RUN")


def test_entrypoint_is_kipside_in_exec_form() -> None:
    assert json.loads(only("ENTRYPOINT")) == ["kipside"]


def test_exposes_bootstrap_and_admin_ports() -> None:
    assert only("EXPOSE").split() == ["9092", "9644"]


def test_pip_installs_without_cache() -> None:
    runs = [rest for kw, rest in instructions() if kw == "RUN" and "pip install" in rest]
    assert runs
    assert all("--no-cache-dir" in run for run in runs)


def test_copied_sources_are_what_the_package_needs_and_not_ignored() -> None:
    sources: list[str] = []
    for kw, rest in instructions():
        if kw == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            sources += parts[:-1]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    # kipside.pipeline.kafka comes with the folder kipside.pipeline maps to (pipeline/).
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    for package in setuptools["packages"]:
        parts = package.split(".")
        top = ".".join(parts[:2]) if parts[0] == "kipside" else parts[0]
        needed.add(folders.get(top, top))
    assert needed <= set(sources), f"COPY misses {needed - set(sources)}"
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not [p for p in patterns if p.startswith("!")], "keep .dockerignore exclude-only"
    for source in sources:
        hits = [p for p in patterns if fnmatch.fnmatch(source, p.removeprefix("**/"))]
        assert not hits, f".dockerignore pattern {hits} excludes COPY source {source!r}"
    for junk in (".git", ".venv", "tests", ".mypy_cache", ".hypothesis"):
        assert junk in patterns


def healthcheck_command() -> list[str]:
    rest = only("HEALTHCHECK")
    options, sep, command = rest.partition("CMD ")
    assert sep, "HEALTHCHECK without CMD"
    assert "--start-period=" in options
    argv = json.loads(command)  # exec form: no shell needed in the image
    assert isinstance(argv, list)
    assert argv[0] == "python", "the image has no curl: the check uses Python"
    return [str(part) for part in argv]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/healthz" else 503
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_healthcheck(url: str, **extra_env: str) -> int:
    argv = healthcheck_command()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(extra_env, KIPSIDE_HEALTHCHECK_URL=url)
    result = subprocess.run(
        [sys.executable, *argv[1:]], env=env, capture_output=True, timeout=20, check=False
    )
    return result.returncode


def test_healthcheck_default_url_is_the_admin_port() -> None:
    env_lines = [rest for kw, rest in instructions() if kw == "ENV"]
    assert any("KIPSIDE_HEALTHCHECK_URL=http://127.0.0.1:9644/healthz" in e for e in env_lines)


def test_healthcheck_passes_on_200_and_fails_otherwise(health_server: str) -> None:
    assert run_healthcheck(f"{health_server}/healthz") == 0
    assert run_healthcheck(f"{health_server}/readyz") != 0  # the stub answers 503
    # An HTTP proxy in the environment must not capture the loopback request.
    assert run_healthcheck(f"{health_server}/healthz", HTTP_PROXY="http://127.0.0.1:9") == 0


def test_healthcheck_fails_when_nothing_listens(health_server: str) -> None:
    port = int(health_server.rsplit(":", 1)[1])
    with http.server.HTTPServer(("127.0.0.1", 0), _Health) as probe:
        free = probe.server_address[1]
    assert free != port
    assert run_healthcheck(f"http://127.0.0.1:{free}/healthz") != 0


def yaml_blocks() -> list[str]:
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    return re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)


def test_every_yaml_block_in_deploy_doc_parses() -> None:
    blocks = yaml_blocks()
    assert len(blocks) >= 4
    for block in blocks:
        documents = list(yaml.safe_load_all(block))
        assert documents and all(doc is not None for doc in documents), block[:80]


def test_deploy_doc_manifests_match_the_image() -> None:
    manifests = [
        doc for block in yaml_blocks() for doc in yaml.safe_load_all(block) if "kind" in doc
    ]
    deployment = next(
        m
        for m in manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"] != "otel-collector"
    )
    pod = deployment["spec"]["template"]["spec"]
    kipside = next(c for c in pod["initContainers"] if c["name"] == "kipside")
    assert kipside["restartPolicy"] == "Always"
    args = kipside["args"]
    assert args[0] == "serve"
    assert "--listen=127.0.0.1:9092" in args and "--admin=0.0.0.0:9644" in args
    uid = only("USER").partition(":")[0]
    assert kipside["securityContext"]["runAsUser"] == int(uid)
    ports = {p["name"]: p["containerPort"] for p in kipside["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ports[kipside[probe]["httpGet"]["port"]] == 9644
    # The rules ConfigMap is mounted as a directory (a subPath mount never gets updates).
    mount = next(m for m in kipside["volumeMounts"] if m["name"] == "kipside-rules")
    assert "subPath" not in mount
    assert f"--rules={mount['mountPath']}/rules.yaml" in args


def test_deploy_doc_rule_file_is_valid() -> None:
    rule_files = [b for b in yaml_blocks() if "kind:" not in b and "coalescing:" in b]
    assert len(rule_files) == 1
    parse_rules(rule_files[0], "docs/deploy.md")  # raises RuleError with FILE:LINE problems
