"""kipside's Kafka codec, sans-I/O: bytes in, frames, headers and messages out, and back.

The proxy (kipside.proxy, on trio) and the pipelines (kipside.pipeline, on blocking sockets) are
two shells over this one codec, and they import only the names listed in ``__all__`` below; the
modules behind them are free to change. The pieces:

- ``Address`` (HOST:PORT, a plain value);
- framing: ``FrameDecoder`` (size-prefixed frames, foreign-protocol sniffing, a size cap);
- headers: request and response headers, correlation ids, ``build_frame``, ``response_frame``;
- ``ApiKey`` and ``api_name``; ``Message`` and the kio adapter (``decode_response`` ...);
- Produce (v3-12) and Fetch (v4-12), hand-written with zero-copy record sets;
- record batches (``RecordBatchView``, re-stamping), small batches (``encode_batch``),
  ``ReadCommittedFilter``, and the client side of one connection (``ClientConnection``);
- ``decode_columns``/``decode_batch_records``: whole batches decoded by a compiled kernel. They
  need the ``pipeline`` extra (numba, numpy, cramjam), so they are imported on first use and a
  proxy without that extra never loads them.
- the values' schema (``ValueSchema``, ``parse_value_schema``: schema files without Spark), and
  columnar carriers (docs/columnar.md): their options, results and errors here, the codec
  (``ColumnarEncoder``, ``decode_columnar_batch`` ...) loaded on first use, as it needs the
  ``columnar`` extra (pyarrow and the record kernels).

This package must never import trio, sockets or any other I/O module, nor kipside.proxy,
kipside.pipeline or kipside.rules: it decides, the shells move bytes (``make lint`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kipside.protocol.address import Address
from kipside.protocol.apis import (
    ApiKey,
    api_name,
    request_header_version,
    response_header_version,
)
from kipside.protocol.batch_builder import Record, encode_batch
from kipside.protocol.client import (
    ClientConnection,
    InFlightRequest,
    Response,
    VersionRange,
    pick_version,
)
from kipside.protocol.columnar import (
    COLUMNAR_COMPRESSIONS,
    COLUMNAR_EXTRA,
    COLUMNAR_HEADER,
    COLUMNAR_VERSION,
    DEFAULT_MAX_DECODED_BYTES,
    LAKE_COLUMNS,
    SEGMENT_COLUMNS,
    ColumnarError,
    ColumnarKeyError,
    ColumnarOptions,
    ColumnarRecord,
    Encoded,
    NotEncodable,
    NotEncodableKind,
    check_columnar_schema,
    columnar_missing,
)
from kipside.protocol.columnar_keys import ColumnarKeyFileError, ColumnarKeys
from kipside.protocol.entities import blank, field_entity
from kipside.protocol.errors import (
    DecodeError,
    FrameError,
    FrameTooLargeError,
    LimitExceeded,
    LocalProtocolError,
    NotKafkaError,
    ProtocolError,
    UnsupportedVersionError,
)
from kipside.protocol.fetch import MAX_VERSION as FETCH_MAX_VERSION
from kipside.protocol.fetch import MIN_VERSION as FETCH_MIN_VERSION
from kipside.protocol.fetch import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FetchPartition,
    FetchResponseData,
    PartitionData,
    encode_fetch_request,
    fetch_request_max_bytes,
    fetch_response_names_nodes,
    parse_fetch_response,
    replace_fetch_records,
)
from kipside.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    encode_frame,
    sniff_foreign_protocol,
    sniff_kafka_request,
)
from kipside.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    build_frame,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    request_body_offset,
    request_correlation_id,
    response_correlation_id,
    response_frame,
    with_request_correlation_id,
    with_response_correlation_id,
)
from kipside.protocol.kafka_errors import ErrorCode, error_name, is_retriable
from kipside.protocol.messages import (
    Message,
    build_request,
    decode_request,
    decode_response,
    encode_message,
    known_versions,
    request_class,
    response_class,
)
from kipside.protocol.primitives import INT16, INT32, Buffer, DecodeLimits, read_uvarint
from kipside.protocol.produce import MAX_VERSION as PRODUCE_MAX_VERSION
from kipside.protocol.produce import MIN_VERSION as PRODUCE_MIN_VERSION
from kipside.protocol.produce import (
    NodeEndpointData,
    PartitionBatch,
    PartitionResult,
    ProduceCounts,
    ProduceRequestData,
    ProduceResponseData,
    count_produce_request,
    encode_produce_request,
    encode_produce_response,
    merge_produce_response,
    parse_produce_request,
    parse_produce_response,
    produce_request_acks,
    produce_response_error_codes,
    produce_response_names_nodes,
)
from kipside.protocol.read_committed import ReadCommittedFilter, Verdict
from kipside.protocol.records import (
    Compression,
    RecordBatchError,
    RecordBatchView,
    TimestampType,
    batch_extent,
    count_batches,
    iter_batches,
    restamp,
)
from kipside.protocol.sasl import (
    PLAIN,
    SASL_MECHANISMS,
    SASL_ROUND_TRIPS,
    SCRAM_DEFAULT_ITERATIONS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    AuthenticationFailed,
    CredentialLookup,
    SaslClient,
    SaslError,
    SaslProtocolError,
    SaslServer,
    ScramCredential,
    new_client,
    new_server,
    scram_credential,
)
from kipside.protocol.value_schema import DDL_SUFFIXES as SCHEMA_DDL_SUFFIXES
from kipside.protocol.value_schema import JSON_SUFFIXES as SCHEMA_JSON_SUFFIXES
from kipside.protocol.value_schema import (
    ArrayOf,
    Atomic,
    DecimalOf,
    MapOf,
    SchemaField,
    StructOf,
    ValueSchema,
    ValueSchemaError,
    ValueType,
    check_reserved_names,
    ddl_field_lines,
    ddl_is_empty,
    parse_ddl_schema,
    parse_json_schema,
    parse_value_schema,
)
from kipside.protocol.waits import request_allowance_ms

if TYPE_CHECKING:
    from kipside.protocol.columnar_codec import (
        CarrierColumns,
        ColumnarEncoder,
        carrier_columns,
        carrier_positions,
        columnar_decryption_properties,
        columnar_version,
        decode_columnar_batch,
        decode_columnar_record,
        decode_producer_columns,
        encode_columnar_batch,
        read_columnar_segment,
        reencode_columnar_batch,
        reencode_if_carrier,
    )
    from kipside.protocol.record_columns import (
        DEFAULT_MAX_DECOMPRESSED_BYTES,
        Binary,
        Columns,
        DecompressionLimitError,
        ScannedBatch,
        columns_of,
        decode_batch_records,
        decode_columns,
        scan_batch,
    )

# The compiled kernel's names, loaded on first use (they need the pipeline extra).
_RECORD_COLUMNS = frozenset(
    {
        "DEFAULT_MAX_DECOMPRESSED_BYTES",
        "Binary",
        "Columns",
        "DecompressionLimitError",
        "ScannedBatch",
        "columns_of",
        "decode_batch_records",
        "decode_columns",
        "scan_batch",
    }
)
# The columnar codec's, likewise (the columnar extra: pyarrow and the kernels).
_COLUMNAR_CODEC = frozenset(
    {
        "CarrierColumns",
        "ColumnarEncoder",
        "carrier_columns",
        "carrier_positions",
        "columnar_decryption_properties",
        "columnar_version",
        "decode_columnar_batch",
        "decode_columnar_record",
        "decode_producer_columns",
        "encode_columnar_batch",
        "read_columnar_segment",
        "reencode_columnar_batch",
        "reencode_if_carrier",
    }
)


def __getattr__(name: str) -> Any:
    if name in _RECORD_COLUMNS:
        from kipside.protocol import record_columns

        return getattr(record_columns, name)
    if name in _COLUMNAR_CODEC:
        from kipside.protocol import columnar_codec

        return getattr(columnar_codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "COLUMNAR_COMPRESSIONS",
    "COLUMNAR_EXTRA",
    "COLUMNAR_HEADER",
    "COLUMNAR_VERSION",
    "DEFAULT_MAX_DECODED_BYTES",
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "FETCH_MAX_VERSION",
    "FETCH_MIN_VERSION",
    "INT16",
    "INT32",
    "LAKE_COLUMNS",
    "PLAIN",
    "PRODUCE_MAX_VERSION",
    "PRODUCE_MIN_VERSION",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "SASL_MECHANISMS",
    "SASL_ROUND_TRIPS",
    "SCHEMA_DDL_SUFFIXES",
    "SCHEMA_JSON_SUFFIXES",
    "SCRAM_DEFAULT_ITERATIONS",
    "SCRAM_MAX_ITERATIONS",
    "SCRAM_MECHANISMS",
    "SCRAM_MIN_ITERATIONS",
    "SEGMENT_COLUMNS",
    "Address",
    "ApiKey",
    "ArrayOf",
    "Atomic",
    "AuthenticationFailed",
    "Binary",
    "Buffer",
    "CarrierColumns",
    "ClientConnection",
    "ColumnarEncoder",
    "ColumnarError",
    "ColumnarKeyError",
    "ColumnarKeyFileError",
    "ColumnarKeys",
    "ColumnarOptions",
    "ColumnarRecord",
    "Columns",
    "Compression",
    "CredentialLookup",
    "DecimalOf",
    "DecodeError",
    "DecodeLimits",
    "DecompressionLimitError",
    "Encoded",
    "ErrorCode",
    "FetchPartition",
    "FetchResponseData",
    "FrameDecoder",
    "FrameError",
    "FrameTooLargeError",
    "InFlightRequest",
    "LimitExceeded",
    "LocalProtocolError",
    "MapOf",
    "Message",
    "NodeEndpointData",
    "NotEncodable",
    "NotEncodableKind",
    "NotKafkaError",
    "PartitionBatch",
    "PartitionData",
    "PartitionResult",
    "ProduceCounts",
    "ProduceRequestData",
    "ProduceResponseData",
    "ProtocolError",
    "ReadCommittedFilter",
    "Record",
    "RecordBatchError",
    "RecordBatchView",
    "RequestHeader",
    "Response",
    "ResponseHeader",
    "SaslClient",
    "SaslError",
    "SaslProtocolError",
    "SaslServer",
    "ScannedBatch",
    "SchemaField",
    "ScramCredential",
    "StructOf",
    "TimestampType",
    "UnsupportedVersionError",
    "ValueSchema",
    "ValueSchemaError",
    "ValueType",
    "Verdict",
    "VersionRange",
    "api_name",
    "batch_extent",
    "blank",
    "build_frame",
    "build_request",
    "carrier_columns",
    "carrier_positions",
    "check_columnar_schema",
    "check_reserved_names",
    "columnar_decryption_properties",
    "columnar_missing",
    "columnar_version",
    "columns_of",
    "count_batches",
    "count_produce_request",
    "ddl_field_lines",
    "ddl_is_empty",
    "decode_batch_records",
    "decode_columnar_batch",
    "decode_columnar_record",
    "decode_columns",
    "decode_producer_columns",
    "decode_request",
    "decode_response",
    "encode_batch",
    "encode_columnar_batch",
    "encode_fetch_request",
    "encode_frame",
    "encode_message",
    "encode_produce_request",
    "encode_produce_response",
    "encode_request_header",
    "encode_response_header",
    "error_name",
    "fetch_request_max_bytes",
    "fetch_response_names_nodes",
    "field_entity",
    "is_retriable",
    "iter_batches",
    "known_versions",
    "merge_produce_response",
    "new_client",
    "new_server",
    "parse_ddl_schema",
    "parse_fetch_response",
    "parse_json_schema",
    "parse_produce_request",
    "parse_produce_response",
    "parse_request_header",
    "parse_response_header",
    "parse_value_schema",
    "pick_version",
    "produce_request_acks",
    "produce_response_error_codes",
    "produce_response_names_nodes",
    "read_columnar_segment",
    "read_uvarint",
    "reencode_columnar_batch",
    "reencode_if_carrier",
    "replace_fetch_records",
    "request_allowance_ms",
    "request_body_offset",
    "request_class",
    "request_correlation_id",
    "request_header_version",
    "response_class",
    "response_correlation_id",
    "response_frame",
    "response_header_version",
    "restamp",
    "scan_batch",
    "scram_credential",
    "sniff_foreign_protocol",
    "sniff_kafka_request",
    "with_request_correlation_id",
    "with_response_correlation_id",
]
