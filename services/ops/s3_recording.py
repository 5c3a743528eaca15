"""The local S3 of ``chronicle up`` kept across restarts.

moto's S3 server holds its objects in memory. ``chronicle up`` starts it with moto's recorder
writing every write request it serves to ``<data dir>/s3-recording.jsonl`` (one JSON object a
line: method, URL, headers, body; reads are left out: services/ops/moto_server.py), and at the
next start replays that file's writes into the new server, so skills, claim-checked bodies and
archive segments outlive a restart as they do on MinIO. After the replay, and again when the stack
stops while the server still runs, the file is rewritten as the server's objects now stand (one
put a bucket and an object): the bytes of an object deleted meanwhile (an erasure's included)
leave the file then.

Pure parts (:func:`writes`, :class:`UploadIds`, :func:`put_line`) beside the thin HTTP shell
(:func:`replay`, :func:`snapshot`, :func:`start_recording`).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from minio import Minio

RECORDING = "s3-recording.jsonl"
"""The file in the data dir that keeps the local S3's writes."""

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})
"""What changes what the server holds; reads are not replayed."""

_DROPPED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "expect", "connection"})
"""Set again for the server replayed into (or meaningless there)."""

_KEPT_META = ("content-type", "cache-control", "content-disposition", "content-encoding", "content-language")


@dataclass(frozen=True)
class Write:
    """One recorded write request: its method, path with query, headers and body."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query, keep_blank_values=True))


def entries(lines: Iterable[str]) -> tuple[list[Any], int]:
    """The JSON values of a recording, in order, and how many fragments did not parse. moto's
    server is threaded and writes an entry and its newline separately, so two requests served at
    once can share a line (``{A}{B}``, the newlines after): each line is read value by value. What
    does not parse (the end of a stack killed while moto wrote it) is counted, not replayed."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    torn = 0
    for line in lines:
        at, end = 0, len(line)
        while True:
            while at < end and line[at].isspace():
                at += 1
            if at >= end:
                break
            try:
                value, at = decoder.raw_decode(line, at)
            except ValueError:
                torn += 1
                break
            out.append(value)
    return out, torn


def writes(values: Iterable[Any]) -> list[Write]:
    """The write requests among a recording's :func:`entries`, in order: reads and moto's own
    API are not replayed, nor an entry that is not a request."""
    out: list[Write] = []
    for entry in values:
        try:
            method = str(entry["method"]).upper()
            url = urlsplit(str(entry["url"]))
            raw = entry.get("body") or ""
            body = base64.b64decode(raw) if entry.get("body_encoded") else str(raw).encode()
            headers = {str(k): str(v) for k, v in dict(entry.get("headers") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if method not in WRITE_METHODS or url.path.startswith("/moto-api/"):
            continue
        target = url.path + (f"?{url.query}" if url.query else "")
        out.append(Write(method, target, headers, body))
    return out


class UploadIds:
    """Multipart uploads replayed: the new server answers a new upload id for each upload the
    recording started, and the recording's later requests name the old one. The first request
    naming an id not seen yet takes the upload last started at its path."""

    def __init__(self) -> None:
        self._started: dict[str, str] = {}
        self._ids: dict[str, str] = {}

    def started(self, path: str, upload_id: str) -> None:
        self._started[path] = upload_id

    def target(self, write: Write) -> str:
        query = write.query()
        old = query.get("uploadId")
        if old is None:
            return write.target
        new = self._ids.setdefault(old, self._started.get(write.path, old))
        query["uploadId"] = new
        return f"{write.path}?{urlencode(query, quote_via=quote)}"


_UPLOAD_ID = re.compile(rb"<UploadId>([^<]+)</UploadId>")


@dataclass(frozen=True)
class Replayed:
    """What :func:`replay` did: writes sent, refused by the server, fragments that did not parse."""

    sent: int = 0
    refused: int = 0
    torn: int = 0


def replay(recording: Path, host: str, port: int) -> Replayed:
    """Send the recording's writes to the S3 server at ``host:port``, in order. No recording:
    nothing sent."""
    if not recording.exists():
        return Replayed()
    with recording.open(encoding="utf-8", errors="replace") as lines:
        values, torn = entries(lines)
    recorded = writes(values)
    ids = UploadIds()
    refused = 0
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        for write in recorded:
            headers = {k: v for k, v in write.headers.items() if k.lower() not in _DROPPED_HEADERS}
            conn.request(write.method, ids.target(write), body=write.body, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            if resp.status >= 300:
                refused += 1
            elif write.method == "POST" and "uploads" in write.query():
                match = _UPLOAD_ID.search(answer)
                if match:
                    ids.started(write.path, match.group(1).decode())
    finally:
        conn.close()
    return Replayed(len(recorded), refused, torn)


def put_line(host: str, port: int, path: str, headers: Mapping[str, str], body: bytes) -> str:
    """One line of moto's recording format: a PUT of ``body`` at ``path``."""
    entry = {
        "headers": dict(headers),
        "method": "PUT",
        "url": f"http://{host}:{port}{path}",
        "body": base64.b64encode(body).decode("ascii"),
        "body_encoded": True,
    }
    return json.dumps(entry) + "\n"


def snapshot(recording: Path, host: str, port: int, access_key: str, secret_key: str, region: str | None) -> int:
    """Rewrite ``recording`` as the server at ``host:port`` now holds its objects: a put of each
    bucket and of each object (body, content type, user metadata); the objects written. The new
    file takes the old one's place at once (a rename), so moto's next recorded request lands in it."""
    client = Minio(f"{host}:{port}", access_key=access_key, secret_key=secret_key, secure=False, region=region)
    tmp = recording.with_name(recording.name + ".tmp")
    objects = 0
    # every object's bytes: readable by its owner alone, as the stack's other secrets are
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as out:
        for bucket in client.list_buckets():
            out.write(put_line(host, port, f"/{quote(bucket.name)}", {}, b""))
            for item in client.list_objects(bucket.name, recursive=True):
                name = item.object_name
                if name is None or item.is_dir:
                    continue
                resp = client.get_object(bucket.name, name)
                try:
                    body = bytes(resp.read())
                    headers = {
                        k: v
                        for k, v in resp.headers.items()
                        if k.lower() in _KEPT_META or k.lower().startswith("x-amz-meta-")
                    }
                finally:
                    resp.close()
                    resp.release_conn()
                out.write(put_line(host, port, f"/{quote(bucket.name)}/{quote(name)}", headers, body))
                objects += 1
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(recording)
    return objects


def own_file(recording: Path) -> None:
    """Make ``recording`` (missing: empty) readable by its owner alone before moto appends to it."""
    os.close(os.open(recording, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    recording.chmod(0o600)


def start_recording(host: str, port: int) -> None:
    """Turn moto's recorder on (it appends each write it serves to its recording file, as
    services/ops/moto_server.py runs it)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/moto-api/recorder/start-recording")
        resp = conn.getresponse()
        resp.read()
        if resp.status >= 300:
            raise OSError(f"moto's recorder did not start: HTTP {resp.status}")
    finally:
        conn.close()
