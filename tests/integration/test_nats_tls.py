"""Chronicle over a TLS-only NATS server (mutual TLS): a CA file and a client certificate from the
settings; and settings read from a secrets directory."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bootstrap import open_container
from services.ops.localstack import free_port, nats_server_binary, wait_for_port
from services.settings import load_settings
from tests.conftest import make_settings
from tests.integration.helpers import text_message


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    key = ["-newkey", "rsa:2048", "-nodes"]
    _openssl("req", "-x509", *key, "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sign = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-extfile", "san.ext"]
    for name in ("server", "client"):
        _openssl("req", *key, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", *sign, "-out", f"{name}.pem", cwd=d)


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    _certificates(tmp_path)
    port = free_port()
    tls = ["--tlsverify", "--tlscacert", str(tmp_path / "ca.pem")]
    tls += ["--tlscert", str(tmp_path / "server.pem"), "--tlskey", str(tmp_path / "server.key")]
    base = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")]
    proc = subprocess.Popen([*base, *tls], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, None, "nats-server (TLS)")
        yield f"tls://127.0.0.1:{port}", tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_stack_runs_over_mutual_tls(tls_nats: tuple[str, Path], fresh_db: str) -> None:
    url, certs = tls_nats
    settings = make_settings(
        url,
        fresh_db,
        nats_tls_ca_file=str(certs / "ca.pem"),
        nats_tls_cert_file=str(certs / "client.pem"),
        nats_tls_key_file=str(certs / "client.key"),
    )
    async with open_container(settings) as c:
        r = await c.commands.append("tenant-a", "tls-1", text_message("m1", "over TLS"), None)
        assert r.seq > 0
        assert await c.publisher.last_subject_seq("tenant-a", "tls-1") == r.seq


def test_settings_come_from_a_secrets_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHRONICLE_DATABASE_URL", raising=False)
    (tmp_path / "chronicle_database_url").write_text("postgresql://svc:s3cret@db.internal:5432/chronicle")
    (tmp_path / "chronicle_summarizer_api_key").write_text("sk-from-a-file")
    monkeypatch.setenv("CHRONICLE_SECRETS_DIR", str(tmp_path))
    settings = load_settings()  # what every `chronicle` command starts from
    assert settings.database_url == "postgresql://svc:s3cret@db.internal:5432/chronicle"
    assert settings.summarizer_api_key == "sk-from-a-file"
