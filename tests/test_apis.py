"""Tests for protocol.apis: the hand-kept flexible-version table checked against kio."""

from __future__ import annotations

from pkgutil import resolve_name
from typing import Any

import pytest
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from kipside.protocol.apis import (
    FIRST_FLEXIBLE_VERSION,
    ApiKey,
    api_name,
    is_flexible,
    request_header_version,
    response_header_version,
)


def _kio_versions() -> list[tuple[int, int, Any, Any]]:
    """(api key, version, request class, response class) for every version kio ships."""
    out = []
    for api_key, name in sorted(api_key_map.items()):
        for version, paths in sorted(schema_name_map[name].items()):
            request = resolve_name(paths[EntityType.request])
            response = resolve_name(paths[EntityType.response])
            out.append((api_key, version, request, response))
    return out


KIO_VERSIONS = _kio_versions()


def test_kio_knows_a_sensible_number_of_versions() -> None:
    # Guards the parametrisation below against silently testing nothing.
    assert len(KIO_VERSIONS) > 300
    assert {key for key, *_ in KIO_VERSIONS} >= {0, 1, 3, 10, 18, 22, 24, 26, 60}


@pytest.mark.parametrize(
    ("api_key", "version", "request_cls", "response_cls"),
    KIO_VERSIONS,
    ids=[f"{api_name(k)}-v{v}" for k, v, *_ in KIO_VERSIONS],
)
def test_flexible_versions_agree_with_kio(
    api_key: int, version: int, request_cls: Any, response_cls: Any
) -> None:
    assert request_cls.__flexible__ is is_flexible(api_key, version), (
        f"FIRST_FLEXIBLE_VERSION[{api_key}] = {FIRST_FLEXIBLE_VERSION[api_key]}, but kio says "
        f"{api_name(api_key)} v{version} flexible={request_cls.__flexible__}"
    )
    assert response_cls.__flexible__ is request_cls.__flexible__
    # kio's own idea of the header schema for each direction.
    request_header = request_cls.__header_schema__.__module__
    response_header = response_cls.__header_schema__.__module__
    assert request_header.endswith(f".v{request_header_version(api_key, version)}.header")
    assert response_header.endswith(f".v{response_header_version(api_key, version)}.header")


def test_every_kio_api_is_in_the_table_under_the_same_name() -> None:
    for api_key, name in api_key_map.items():
        assert api_key in FIRST_FLEXIBLE_VERSION
        assert ApiKey(api_key).name == name.upper()


def test_table_covers_exactly_the_api_keys() -> None:
    assert set(FIRST_FLEXIBLE_VERSION) == {int(k) for k in ApiKey}


def test_first_flexible_is_the_boundary() -> None:
    for api_key, first in FIRST_FLEXIBLE_VERSION.items():
        if first is None:
            assert not any(is_flexible(api_key, v) for v in range(40))
            continue
        assert is_flexible(api_key, first)
        if first > 0:
            assert not is_flexible(api_key, first - 1)


def test_header_versions() -> None:
    assert request_header_version(ApiKey.PRODUCE, 8) == 1
    assert request_header_version(ApiKey.PRODUCE, 9) == 2
    assert response_header_version(ApiKey.PRODUCE, 8) == 0
    assert response_header_version(ApiKey.PRODUCE, 9) == 1
    assert request_header_version(ApiKey.API_VERSIONS, 3) == 2
    for version in range(10):
        assert response_header_version(ApiKey.API_VERSIONS, version) == 0
    # SaslHandshake and OffsetDelete were never flexible.
    assert request_header_version(ApiKey.SASL_HANDSHAKE, 1) == 1
    assert response_header_version(ApiKey.OFFSET_DELETE, 0) == 0


def test_unknown_api_keys_stay_opaque() -> None:
    assert not is_flexible(1000, 5)
    assert request_header_version(1000, 5) == 1
    assert response_header_version(1000, 5) == 0


def test_api_names() -> None:
    assert api_name(0) == "Produce"
    assert api_name(ApiKey.ADD_PARTITIONS_TO_TXN) == "AddPartitionsToTxn"
    assert api_name(18) == "ApiVersions"
    assert api_name(999) == "Api(999)"
