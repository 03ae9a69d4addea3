"""The rules package is a pure model: a rule file is data, so rules/ never pulls in the shell
(trio, sockets, proxy, pipeline) and never loads YAML but with SafeLoader."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from rules_kit import REPO

RULES_PACKAGE = REPO / "rules"

# A rule file is data: the rules package is a pure model that never pulls in the shell.
_SHELL_MODULES = {"trio", "socket", "selectors", "ssl", "asyncio"}
_SHELL_PACKAGES = ("kipside.proxy", "kipside.pipeline")


def _is_shell(module: str) -> bool:
    parts = module.split(".")
    return parts[0] in _SHELL_MODULES or ".".join(parts[:2]) in _SHELL_PACKAGES


def test_shell_check_knows_the_real_names() -> None:
    assert _is_shell("trio") and _is_shell("socket") and _is_shell("asyncio.events")
    assert _is_shell("kipside.proxy") and _is_shell("kipside.pipeline.kafka")
    assert not _is_shell("kipside.protocol") and not _is_shell("kipside.rules.model")
    assert not _is_shell("kipside.proxyish") and not _is_shell("pydantic")


def test_rules_package_is_pure() -> None:
    """No shell imports (trio, sockets, proxy, pipeline), and no YAML loader but SafeLoader."""
    for path in sorted(RULES_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, (path, node.lineno, "imports are absolute")
                modules = [node.module or ""]
            else:
                modules = []
            for module in modules:
                assert not _is_shell(module), (path, module)
            if isinstance(node, ast.Attribute):
                assert node.attr not in {
                    "load",
                    "load_all",
                    "full_load",
                    "unsafe_load",
                    "Loader",
                    "FullLoader",
                    "UnsafeLoader",
                    "CLoader",
                    "CFullLoader",
                    "CUnsafeLoader",
                }, (path, node.lineno, node.attr)
    # What is loaded at run time, with the packages rules depends on. kio imports hypothesis
    # when it is installed (here, for the tests), and hypothesis's plugins import trio; a
    # deployment has no hypothesis, so leave its plugins out.
    code = (
        "import sys, kipside.rules; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'trio'"
        f" or '.'.join(m.split('.')[:2]) in {_SHELL_PACKAGES});"
        " assert not bad, bad"
    )
    env = {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)
