"""The local S3's recording (services/ops/s3_recording.py): which recorded requests are replayed,
and multipart uploads renamed to the ids the new server answers."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from services.ops.localstack import _children
from services.ops.s3_recording import UploadIds, Write, entries, put_line, writes


def line(method: str, url: str, body: bytes = b"", **headers: str) -> str:
    entry = {
        "headers": headers,
        "method": method,
        "url": url,
        "body": base64.b64encode(body).decode(),
        "body_encoded": True,
    }
    return json.dumps(entry)


def test_only_writes_are_replayed_and_a_torn_last_line_is_passed_over() -> None:
    recorded = [
        line("PUT", "http://127.0.0.1:9000/skills", b""),
        line("GET", "http://127.0.0.1:9000/skills/a.md"),
        line("HEAD", "http://127.0.0.1:9000/skills/a.md"),
        line("PUT", "http://127.0.0.1:9000/skills/a.md?x=1", b"doc", **{"Content-Type": "text/markdown"}),
        line("POST", "http://127.0.0.1:9000/moto-api/recorder/start-recording"),
        line("DELETE", "http://127.0.0.1:9000/skills/a.md"),
        line("PUT", "http://127.0.0.1:9000/skills/b.md", b"cut")[:40],
    ]
    values, torn = entries(recorded)
    assert writes(values) == [
        Write("PUT", "/skills", {}, b""),
        Write("PUT", "/skills/a.md?x=1", {"Content-Type": "text/markdown"}, b"doc"),
        Write("DELETE", "/skills/a.md", {}, b""),
    ]
    assert torn == 1


def test_two_requests_moto_wrote_on_one_line_are_both_replayed() -> None:
    """moto's threads write an entry and its newline apart: two bodies put at once can land as
    ``{A}{B}`` and two newlines; the line was passed over whole, losing both objects."""
    a = line("PUT", "http://h:1/b/a", b"A" * 10_000)
    b = line("PUT", "http://h:1/b/b", b"B" * 10_000)
    values, torn = entries([a + b + "\n", "\n"])
    assert [(w.target, len(w.body)) for w in writes(values)] == [("/b/a", 10_000), ("/b/b", 10_000)]
    assert torn == 0


def test_a_recorded_upload_id_becomes_the_one_its_path_was_last_given() -> None:
    ids = UploadIds()
    start = writes(entries([line("POST", "http://h:1/b/big?uploads=")])[0])[0]
    assert ids.target(start) == "/b/big?uploads="
    ids.started(start.path, "NEW-1")
    part, done = writes(
        entries(
            [
                line("PUT", "http://h:1/b/big?partNumber=1&uploadId=OLD-1"),
                line("POST", "http://h:1/b/big?uploadId=OLD-1"),
            ]
        )[0]
    )
    assert ids.target(part) == "/b/big?partNumber=1&uploadId=NEW-1"
    ids.started(start.path, "NEW-2")  # a later upload at the same path keeps OLD-1's mapping
    assert ids.target(done) == "/b/big?uploadId=NEW-1"


def test_a_snapshot_line_is_a_put_the_replay_reads_back() -> None:
    [write] = writes(
        entries([put_line("127.0.0.1", 9000, "/skills/t%2Fa.md", {"x-amz-meta-description": "d"}, b"\x00doc")])[0]
    )
    assert write == Write("PUT", "/skills/t%2Fa.md", {"x-amz-meta-description": "d"}, b"\x00doc")


def test_a_child_is_kept_serving_until_its_before_stop_ran() -> None:
    seen: list[int | None] = []
    with _children() as procs:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(proc)
        procs.before_stop[proc.pid] = lambda: seen.append(proc.poll())
    assert seen == [None]
    assert proc.poll() is not None
