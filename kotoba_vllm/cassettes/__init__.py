"""Cassettes: recorded (or derived) HTTP exchanges with an engine, as EDN files.

Public here: the `Cassette` data and its file I/O (`load_cassettes`, `read_cassette`,
`write_cassette`, ...). The machinery that records, replays and compares them lives in
this package's private modules (`_recorder`, `_replay`, `_expect`, `_compare`, `_drift`, ...).
"""

from ._format import (Cassette, CassetteError, DEFAULT_ROOT, ENGINES, KEPT_HEADERS, cassette_body, cassette_from_edn,
                      cassette_json, load_cassettes, read_cassette, request_json, sse_payloads, write_cassette)

__all__ = ["Cassette", "CassetteError", "DEFAULT_ROOT", "ENGINES", "KEPT_HEADERS", "cassette_body",
           "cassette_from_edn", "cassette_json", "load_cassettes", "read_cassette", "request_json", "sse_payloads",
           "write_cassette"]
