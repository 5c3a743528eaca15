"""The stack ``chronicle up`` records in its data dir (``stack.json``), as the settings of a
command run beside it take it: its NATS address unless CHRONICLE_NATS_URL is set, and with that
address its operator seed, key-encryption key and database unless one is set."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from services.ops.cli import UNREACHABLE_EXIT, main
from services.ops.localstack import without_password
from services.settings import STACK_RECORD, LocalStack, Settings, UnusableSetting, new_operator_seed

URL = "nats://127.0.0.1:18120"
DATABASE = "postgresql://postgres:@/chronicle?host=/srv/chronicle/pg"  # embedded Postgres' socket


@pytest.fixture(autouse=True)
def _no_stack_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the environment running the tests sets, these settings are set only here."""
    names = ("NATS_URL", "NATS_NKEY_SEED", "NATS_CREDS_FILE", "KEK", "KEK_FILE", "DATA_DIR", "DATABASE_URL")
    for name in (*names, "S3_ENDPOINT", "S3_SECURE", "ENCRYPTION"):
        monkeypatch.delenv(f"CHRONICLE_{name}", raising=False)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, str]:
    """A data dir as ``chronicle up`` leaves it: the record, the operator seed and the key files."""
    seed = new_operator_seed()
    (tmp_path / "nats-operator.nk").write_text(seed + "\n")
    (tmp_path / "kek").write_text("k1:" + "A" * 43 + "=\n")
    LocalStack(URL, str(tmp_path / "nats-operator.nk"), str(tmp_path / "kek"), DATABASE).write(tmp_path)
    return tmp_path, seed


def test_without_a_record_the_settings_are_as_they_are(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path))
    assert settings.with_local_stack() is settings
    assert settings.nats_url == "nats://127.0.0.1:4222"


def test_a_command_beside_the_stack_reaches_it_with_its_identity_and_key(recorded: tuple[Path, str]) -> None:
    data, seed = recorded
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_url == URL
    assert settings.nats_nkey_seed is not None
    assert settings.nats_nkey_seed.get_secret_value() == seed
    assert settings.kek_file == str(data / "kek")
    assert settings.database_url == DATABASE


def test_a_command_beside_the_stack_uses_its_s3_endpoint_unless_one_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up --s3-port 9123`` serves its S3 there: a command beside it (``skills put``, ``erase
    --bucket``) went to the default 127.0.0.1:9000, where nothing (or another stack's) answers."""
    LocalStack(URL, s3_endpoint="http://127.0.0.1:9123").write(tmp_path)
    settings = Settings(data_dir=str(tmp_path)).with_local_stack()
    assert (settings.s3_endpoint, settings.s3_secure) == ("127.0.0.1:9123", False)
    assert LocalStack.read(tmp_path) == LocalStack(URL, s3_endpoint="http://127.0.0.1:9123")
    monkeypatch.setenv("CHRONICLE_S3_ENDPOINT", "minio.internal:9000")
    assert Settings(data_dir=str(tmp_path)).with_local_stack().s3_endpoint == "minio.internal:9000"


def test_a_command_beside_a_sealing_stack_seals_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up`` seals (CHRONICLE_ENCRYPTION set for its processes alone): ``chronicle skills put``
    beside it, with its data dir alone, took the default (off) and published its ``skill.indexed``
    unsealed, the skill's key, description and etag in the log for good, past any erasure."""
    LocalStack(URL, encryption=True).write(tmp_path)
    assert LocalStack.read(tmp_path) == LocalStack(URL, encryption=True)
    assert Settings(data_dir=str(tmp_path)).with_local_stack().encryption is True
    monkeypatch.setenv("CHRONICLE_ENCRYPTION", "false")  # a setting always wins
    assert Settings(data_dir=str(tmp_path)).with_local_stack().encryption is False
    monkeypatch.delenv("CHRONICLE_ENCRYPTION")
    LocalStack(URL, encryption=False).write(tmp_path)  # `up` given CHRONICLE_ENCRYPTION=false
    assert Settings(data_dir=str(tmp_path), encryption=True).with_local_stack().encryption is True
    assert Settings(data_dir=str(tmp_path)).with_local_stack().encryption is False


def test_a_command_beside_a_stack_sealing_with_a_key_from_its_environment_says_where_sealing_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up`` given CHRONICLE_KEK records no key file and ``encryption: true``: a command beside it
    without the key was refused with "CHRONICLE_ENCRYPTION is on", a setting the user never made.
    The refusal names the record and what to set."""
    monkeypatch.delenv("CHRONICLE_ENCRYPTION", raising=False)
    monkeypatch.delenv("CHRONICLE_KEK", raising=False)
    monkeypatch.delenv("CHRONICLE_KEK_FILE", raising=False)
    LocalStack(URL, encryption=True).write(tmp_path)
    settings = Settings(data_dir=str(tmp_path)).with_local_stack()
    with pytest.raises(UnusableSetting) as refused:
        settings.sealing_key_wrapper()
    assert str(refused.value).startswith(f"{tmp_path / STACK_RECORD} (`chronicle up`'s record of its stack) says")
    assert "set the same here, or CHRONICLE_ENCRYPTION=false" in str(refused.value)
    # set here, it is the setting's refusal, as before
    with pytest.raises(UnusableSetting, match=r"^CHRONICLE_ENCRYPTION is on and no key-encryption key is set"):
        Settings(data_dir=str(tmp_path), encryption=True).with_local_stack().sealing_key_wrapper()
    assert Settings(data_dir=str(tmp_path), encryption=False).with_local_stack().sealing_key_wrapper() is None


def test_a_record_of_an_earlier_release_without_a_key_file_leaves_encryption_as_set(tmp_path: Path) -> None:
    (tmp_path / STACK_RECORD).write_text(f'{{"nats_url": "{URL}"}}')
    assert Settings(data_dir=str(tmp_path)).with_local_stack().encryption is False
    assert Settings(data_dir=str(tmp_path), encryption=True).with_local_stack().encryption is True


def test_a_record_of_an_earlier_release_with_its_own_key_file_seals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier ``up`` recorded no ``encryption``; one that made its own key (``kek_file``)
    sealed (by default since 12-01): a ``skills put`` beside it took the default (off) and wrote
    its ``skill.indexed`` in plaintext. A setting still wins."""
    monkeypatch.delenv("CHRONICLE_ENCRYPTION", raising=False)
    kek = tmp_path / "kek"
    (tmp_path / STACK_RECORD).write_text(f'{{"nats_url": "{URL}", "nats_nkey_seed_file": null, "kek_file": "{kek}"}}')
    assert LocalStack.read(tmp_path) == LocalStack(URL, kek_file=str(kek), encryption=True)
    assert Settings(data_dir=str(tmp_path)).with_local_stack().encryption is True
    assert Settings(data_dir=str(tmp_path), encryption=False).with_local_stack().encryption is False


def test_a_database_url_that_is_set_wins(recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = recorded
    monkeypatch.setenv("CHRONICLE_DATABASE_URL", "postgresql://postgres@db.internal/chronicle")
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_url == URL
    assert settings.database_url == "postgresql://postgres@db.internal/chronicle"


def test_a_record_of_an_earlier_release_leaves_the_database_as_set(tmp_path: Path) -> None:
    (tmp_path / STACK_RECORD).write_text(f'{{"nats_url": "{URL}", "nats_nkey_seed_file": null, "kek_file": null}}')
    settings = Settings(data_dir=str(tmp_path)).with_local_stack()
    assert (settings.nats_url, settings.database_url) == (URL, Settings().database_url)


def test_an_explicit_nats_url_wins_and_takes_nothing_of_the_stack(
    recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data, _ = recorded
    monkeypatch.setenv("CHRONICLE_NATS_URL", "nats://elsewhere:4222")
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_url == "nats://elsewhere:4222"
    assert settings.nats_nkey_seed is None
    assert settings.kek_file is None
    assert settings.database_url == Settings().database_url


def test_the_stacks_url_set_explicitly_still_takes_its_identity(
    recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data, seed = recorded
    monkeypatch.setenv("CHRONICLE_NATS_URL", URL)
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_nkey_seed is not None
    assert settings.nats_nkey_seed.get_secret_value() == seed


def test_a_seed_or_key_that_is_set_wins(recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = recorded
    mine = new_operator_seed()
    monkeypatch.setenv("CHRONICLE_NATS_NKEY_SEED", mine)
    monkeypatch.setenv("CHRONICLE_KEK_FILE", "/run/secrets/kek")
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_url == URL
    assert settings.nats_nkey_seed is not None
    assert settings.nats_nkey_seed.get_secret_value() == mine
    assert settings.kek_file == "/run/secrets/kek"


def test_a_credentials_file_is_an_identity_too(recorded: tuple[Path, str]) -> None:
    data, _ = recorded
    settings = Settings(data_dir=str(data), nats_creds_file="/etc/nats/chronicle.creds").with_local_stack()
    assert (settings.nats_url, settings.nats_nkey_seed) == (URL, None)


def test_a_stack_given_its_secrets_by_its_environment_records_none(tmp_path: Path) -> None:
    LocalStack(URL).write(tmp_path)
    settings = Settings(data_dir=str(tmp_path)).with_local_stack()
    assert (settings.nats_url, settings.nats_nkey_seed, settings.kek_file) == (URL, None, None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"nats_url": ""}',
        '{"nats_url": 5}',
        '{"kek_file": "/k"}',
        f'{{"nats_url": "{URL}", "database_url": 5}}',
        f'{{"nats_url": "{URL}", "database_url": "mysql://h/db"}}',
        f'{{"nats_url": "{URL}", "encryption": "yes"}}',
    ],
)
def test_a_record_that_is_not_one_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / STACK_RECORD).write_text(text)
    with pytest.raises(UnusableSetting, match=re.escape(f"{tmp_path / STACK_RECORD} is not `chronicle up`'s record")):
        Settings(data_dir=str(tmp_path)).with_local_stack()


def test_a_recorded_seed_file_that_is_gone_is_named(recorded: tuple[Path, str]) -> None:
    data, _ = recorded
    (data / "nats-operator.nk").unlink()
    with pytest.raises(UnusableSetting, match=r"the local stack's operator seed .* cannot be read"):
        Settings(data_dir=str(data)).with_local_stack()


def test_a_command_beside_a_stack_that_is_gone_names_the_recorded_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its database taken from the record (embedded Postgres' socket, gone with the stack): the
    line says where the address came from, not CHRONICLE_DATABASE_URL, which is not set."""
    gone = f"postgresql://postgres:@/chronicle?host={tmp_path / 'pg'}"
    LocalStack(URL, None, None, gone).write(tmp_path)
    monkeypatch.setenv("CHRONICLE_DATA_DIR", str(tmp_path))
    assert main(["quarantine", "list"]) == UNREACHABLE_EXIT
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"chronicle quarantine: the database `chronicle up` recorded in {tmp_path / STACK_RECORD} "
        f"(the Unix socket {tmp_path / 'pg'}/.s.PGSQL.5432, database chronicle; is that stack running? "
        "Set CHRONICLE_DATABASE_URL for another) "
        "cannot be used: "
    ), line


def test_the_record_is_replaced_whole(tmp_path: Path) -> None:
    LocalStack("nats://127.0.0.1:4250", "/a/seed", "/a/kek").write(tmp_path)
    LocalStack(URL).write(tmp_path)
    assert LocalStack.read(tmp_path) == LocalStack(URL)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STACK_RECORD]


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_record_others_may_write_is_not_followed(recorded: tuple[Path, str], mode: int) -> None:
    """It sends the operator's identity to the server it names: a record in a directory others
    can write (a shared working directory's .chronicle, say) could send it anywhere."""
    data, _ = recorded
    (data / STACK_RECORD).chmod(mode)
    with pytest.raises(UnusableSetting, match=re.escape(f"{data / STACK_RECORD} is not followed")):
        Settings(data_dir=str(data)).with_local_stack()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_record_of_another_user_is_not_followed(recorded: tuple[Path, str]) -> None:
    data, _ = recorded
    os.chown(data / STACK_RECORD, 65534, 65534)
    with pytest.raises(UnusableSetting, match=re.escape(f"{data / STACK_RECORD} is not followed")):
        Settings(data_dir=str(data)).with_local_stack()


def test_the_stacks_address_given_as_a_bare_host_port_still_takes_its_identity(
    recorded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``CHRONICLE_NATS_URL=127.0.0.1:<port>``, the stack's address without its scheme, went
    without the stack's identity: "authorization failed".) A bare host:port is nats://host:port."""
    data, seed = recorded
    monkeypatch.setenv("CHRONICLE_NATS_URL", URL.removeprefix("nats://"))
    settings = Settings(data_dir=str(data)).with_local_stack()
    assert settings.nats_url == URL
    assert settings.nats_nkey_seed is not None
    assert settings.nats_nkey_seed.get_secret_value() == seed


@pytest.mark.parametrize(
    ("used", "recorded"),
    [
        ("postgresql://postgres@127.0.0.1:5432/chronicle", "postgresql://postgres@127.0.0.1:5432/chronicle"),
        (DATABASE, DATABASE),
        ("postgresql://u:hunter2@db.internal:5433/chronicle", "user=u dbname=chronicle host=db.internal port=5433"),
        ("host=db.internal password=hunter2 dbname=chronicle", "dbname=chronicle host=db.internal"),
    ],
)
def test_up_records_its_database_without_a_password(used: str, recorded: str) -> None:
    assert without_password(used) == recorded


def test_the_readmes_backup_one_liner_reads_the_database_url_up_records(tmp_path: Path) -> None:
    """The README's backup section says where the URL is under ``chronicle up`` (embedded Postgres:
    CHRONICLE_DATABASE_URL is not set); its command reads the record ``up`` writes."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Backups: what the log cannot restore\n", 1)[1].split("\n## ", 1)[0]
    [line] = [ln for ln in section.splitlines() if ln.startswith("CHRONICLE_DATABASE_URL=$(python3 -c ")]
    data = tmp_path / ".chronicle"
    data.mkdir()
    LocalStack(URL, database_url=DATABASE).write(data)
    done = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$CHRONICLE_DATABASE_URL"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, DATABASE, "")
