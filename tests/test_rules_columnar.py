"""Tests for the rule files' `topics` section and its `columnar` rules: the files a rule names are
read relative to the rule file, a problem in one is reported at the key naming it with the named
file's own FILE:LINE, and the rule gives the codec its schema and options."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from rules_kit import REPO

from kipside.protocol import ColumnarOptions
from kipside.rules import RuleError, RuleSet, load_rules, parse_rules
from kipside.rules import loader as rule_loader

KEY = base64.b64encode(bytes(range(32))).decode()
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
    },
    "required": ["id"],
}
RULES = """\
topics:
  - topic: orders.audit
  - topic: "orders.*"
    columnar:
      schema: schemas/orders.json
      lossless: true
      encrypt:
        columns: [user, kafka_key]
        key_file: keys.yaml
  - topic: "events"
    columnar:
      encoding: parquet
      schema: events.ddl
      compression: snappy
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "orders.json").write_text(json.dumps(SCHEMA, indent=2))
    (tmp_path / "events.ddl").write_text("id BIGINT NOT NULL,\nname STRING\n")
    (tmp_path / "keys.yaml").write_text(f"write_key: k1\nkeys:\n  k1: {KEY}\n")
    (tmp_path / "kipside.yaml").write_text(RULES)
    return tmp_path


def test_columnar_rules(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # named files are found from the rule file's folder, not the cwd
    rules = load_rules(folder / "kipside.yaml")
    assert rules.columnar_for("orders.audit") is None  # the first match wins, and has none
    assert rules.columnar_for("payments") is None
    orders = rules.columnar_for("orders.new")
    assert orders is not None
    assert orders.value_schema.struct.names() == ["id", "user", "at"]
    assert orders.value_schema.source == str(folder / "schemas" / "orders.json")
    assert orders.arrow_schema().field("id") == pa.field("id", pa.int64(), False)
    assert orders.keys is not None and orders.keys.write_key == "k1"
    assert orders.options() == ColumnarOptions(
        compression="zstd", lossless=True, encrypt=("user", "kafka_key"), keys=orders.keys
    )
    events = rules.columnar_for("events")
    assert events is not None and events.keys is None
    assert events.options() == ColumnarOptions(compression="snappy")
    assert events.value_schema.required == ("id",)


def test_describe_writes_the_rule_as_written(folder: Path) -> None:
    rules = load_rules(folder / "kipside.yaml")
    described = rules.describe()
    assert described["topics"] == [
        {"topic": "orders.audit"},
        {
            "topic": "orders.*",
            "columnar": {
                "encoding": "parquet",
                "schema": "schemas/orders.json",
                "compression": "zstd",
                "lossless": True,
                "encrypt": {"columns": ["user", "kafka_key"], "key_file": "keys.yaml"},
            },
        },
        {
            "topic": "events",
            "columnar": {
                "encoding": "parquet",
                "schema": "events.ddl",
                "compression": "snappy",
                "lossless": False,
            },
        },
    ]
    assert KEY not in repr(rules) and KEY not in json.dumps(described)
    body = {k: v for k, v in described.items() if k not in ("source", "version")}
    again = parse_rules(yaml.safe_dump(body), str(folder / "again.yaml"))
    assert again.topics == rules.topics


def test_the_version_covers_the_named_files(folder: Path) -> None:
    before = load_rules(folder / "kipside.yaml").version
    (folder / "events.ddl").write_text("id BIGINT NOT NULL,\nname STRING,\nn INT\n")
    after = load_rules(folder / "kipside.yaml")
    assert after.version != before  # so a reload applies the edited schema
    events = after.columnar_for("events")
    assert events is not None and events.value_schema.struct.names() == ["id", "name", "n"]


def test_files_are_read_through_read_file() -> None:
    files = {
        "/etc/kipside/s.ddl": "id BIGINT",
    }
    text = "topics:\n  - topic: t\n    columnar:\n      schema: s.ddl\n"
    rules = parse_rules(text, "/etc/kipside/kipside.yaml", read_file=files.__getitem__)
    rule = rules.columnar_for("t")
    assert rule is not None and rule.value_schema.struct.names() == ["id"]


def test_a_rule_built_in_code_has_no_schema() -> None:
    from kipside.rules import ColumnarRule

    with pytest.raises(LookupError, match="not made by the rule loader"):
        _ = ColumnarRule(schema="s.json").value_schema


def problems(folder: Path, rules: str) -> list[str]:
    (folder / "kipside.yaml").write_text(rules)
    with pytest.raises(RuleError) as info:
        load_rules(folder / "kipside.yaml")
    prefix = str(folder) + os.sep
    return [str(p).replace(prefix, "") for p in info.value.problems]


def columnar(body: str) -> str:
    return "topics:\n  - topic: t\n    columnar:\n" + "".join(
        f"      {line}\n" for line in body.splitlines()
    )


def test_refused_values(folder: Path) -> None:
    assert problems(folder, columnar("schema: events.ddl\ncompression: brotli")) == [
        "kipside.yaml:5: topics[0].columnar.compression: expected one of zstd, snappy, gzip, "
        "lz4, none, got 'brotli' (a string)"
    ]
    assert problems(folder, columnar("schema: events.ddl\nencoding: avro")) == [
        "kipside.yaml:5: topics[0].columnar.encoding: expected parquet (the one encoding there "
        "is), got 'avro' (a string)"
    ]
    assert problems(folder, columnar("compression: zstd")) == [
        "kipside.yaml:4: topics[0].columnar.schema: missing required key 'schema'; add it to "
        "this entry"
    ]
    assert problems(
        folder, columnar("schema: events.ddl\nencrypt:\n  columns: []\n  key_file: k")
    ) == [
        "kipside.yaml:6: topics[0].columnar.encrypt.columns: expected a list of the schema's "
        "top-level field names (or kafka_key, kafka_headers), got a list"
    ]
    assert problems(folder, columnar("schema: events.ddl\nlosless: true")) == [
        "kipside.yaml:5: topics[0].columnar.losless: unknown key 'losless' (did you mean "
        "'lossless'?); allowed keys here are: encoding, schema, compression, lossless, encrypt"
    ]


def test_problems_in_named_files(folder: Path) -> None:
    (folder / "bad.json").write_text(
        '{"type": "object",\n "properties": {\n  "id": {"type": "integer"},\n'
        '  "amount": {"type": "decimal"}}}\n'
    )
    (folder / "map.ddl").write_text("id BIGINT,\nm MAP<STRING, INT>\n")
    (folder / "bad-keys.yaml").write_text("write_key: k1\nkeys:\n  k1: c2hvcnQ=\n")
    text = (
        "topics:\n"
        "  - topic: a\n    columnar:\n      schema: nowhere.json\n"
        "  - topic: b\n    columnar:\n      schema: bad.json\n"
        "  - topic: c\n    columnar:\n      schema: map.ddl\n"
        "  - topic: d\n    columnar:\n      schema: events.ddl\n"
        "      encrypt:\n        columns: [name, nope]\n        key_file: bad-keys.yaml\n"
    )
    assert problems(folder, text) == [
        "kipside.yaml:4: topics[0].columnar.schema: no such file: nowhere.json; check the path "
        "(relative paths start from the rule file's folder)",
        "kipside.yaml:7: topics[1].columnar.schema: bad.json:4: property 'amount': type "
        "'decimal' is not supported (use string, integer, number, boolean, array or object); "
        "fix the schema file",
        "kipside.yaml:10: topics[2].columnar.schema: map.ddl:2: field 'm' holds a MAP (write it "
        "as a STRUCT of the fields, or a STRING): a columnar topic keeps values exactly, and "
        "this type can't; fix the schema file",
        "kipside.yaml:15: topics[3].columnar.encrypt.columns[1]: 'nope' is not a top-level "
        "field of events.ddl (its fields: id, name); name one of them, kafka_key or "
        "kafka_headers",
        "kipside.yaml:16: topics[3].columnar.encrypt.key_file: bad-keys.yaml:3: key 'k1': 5 "
        "bytes; an AES key is 16, 24 or 32 bytes (e.g. `openssl rand -base64 32`); fix the key "
        "file",
    ]


def test_without_the_columnar_extra_the_rule_says_what_to_install(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = (
        "columnar topics need pyarrow, which is not installed: pip install 'kipside[columnar]'"
    )
    monkeypatch.setattr(rule_loader, "columnar_missing", lambda: missing)
    assert problems(folder, RULES) == [
        f"kipside.yaml:5: topics[1].columnar: {missing}",
        f"kipside.yaml:12: topics[2].columnar: {missing}",
    ]
    # Rules without a columnar topic load as before.
    (folder / "kipside.yaml").write_text("topics:\n  - topic: t\n")
    assert load_rules(folder / "kipside.yaml").topics[0].columnar is None


def test_columnar_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from kipside.protocol import columnar_missing

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    assert columnar_missing() == (
        "columnar topics need pyarrow, which is not installed: pip install 'kipside[columnar]'"
    )


def test_loading_columnar_rules_loads_no_pyarrow(folder: Path) -> None:
    code = (
        "import sys\nfrom kipside.rules import load_rules\n"
        f"rules = load_rules({str(folder / 'kipside.yaml')!r})\n"
        "assert rules.columnar_for('orders.x') is not None\n"
        "assert 'pyarrow' not in sys.modules and 'numba' not in sys.modules, 'loaded'\n"
    )
    env = {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)


def test_the_example_file(monkeypatch: pytest.MonkeyPatch) -> None:
    example = REPO / "rules" / "examples" / "columnar.yaml"
    rules: RuleSet = load_rules(example)
    assert rules.columnar_for("orders.audit") is None
    orders = rules.columnar_for("orders.placed")
    assert orders is not None and orders.encrypt is not None
    assert orders.value_schema.struct.names()[:3] == ["id", "user", "amount"]


def test_the_documented_error_is_real() -> None:
    bad = (
        '{\n  "type": "object",\n  "properties": {\n    "id": {"type": "integer"},\n'
        '    "amount": {"type": "decimal"}\n  }\n}\n'
    )
    text = (
        'topics:\n  - topic: orders.audit\n  - topic: "orders.*"\n    columnar:\n'
        "      encoding: parquet\n      compression: zstd\n      schema: orders.json\n"
    )
    with pytest.raises(RuleError) as info:
        parse_rules(text, "kipside.yaml", read_file={"orders.json": bad}.__getitem__)
    assert str(info.value) in (REPO / "docs" / "rules.md").read_text().splitlines()
