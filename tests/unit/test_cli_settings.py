"""A setting that is not one stops every command with a line naming its variable (exit 2), not a
traceback; a secret's value is never echoed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.ops.cli import SETTINGS_EXIT, main
from services.settings import KeyGrant, Settings, UnusableSetting, api_key_entry, hash_key


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "CHRONICLE_API_BODY_TIMEOUT_S",
            "0",
            "setting CHRONICLE_API_BODY_TIMEOUT_S: Input should be greater than 0 (given: '0')",
        ),
        ("CHRONICLE_API_PORT", "abc", "setting CHRONICLE_API_PORT: Input should be a valid integer"),
    ],
)
def test_a_malformed_setting_is_named_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["verify"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert err.startswith(f"chronicle verify: {said}"), err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_two_malformed_settings_are_a_line_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHRONICLE_API_PORT", "abc")
    monkeypatch.setenv("CHRONICLE_API_BODY_TIMEOUT_S", "-1")
    assert main(["api"]) == SETTINGS_EXIT
    lines = capsys.readouterr().err.strip().splitlines()
    assert sorted(line.split(":")[1].strip() for line in lines) == [
        "setting CHRONICLE_API_BODY_TIMEOUT_S",
        "setting CHRONICLE_API_PORT",
    ]


def test_a_secret_settings_value_is_not_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHRONICLE_API_KEYS", "not-json-sk-live-12345")
    assert main(["verify"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert "setting CHRONICLE_API_KEYS" in err
    assert "sk-live-12345" not in err


def test_the_process_exits_2_with_the_line_and_no_traceback() -> None:
    env = {"PATH": "/usr/bin:/bin", "CHRONICLE_API_BODY_TIMEOUT_S": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "api"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert done.stderr.strip() == (
        "chronicle api: setting CHRONICLE_API_BODY_TIMEOUT_S: Input should be greater than 0 (given: '0')"
    )


def test_a_malformed_api_keys_entry_is_one_line_naming_it_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry pasted with a typo (its digest cut short): the API used to start, build its key
    table and die with a traceback; every command now names the setting and the entry, by its
    place and its tenant."""
    monkeypatch.setenv("CHRONICLE_API_KEYS", f'["acme:{"a" * 64}", "acme:6d5fbdaf3b"]')
    assert main(["api"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "chronicle api: setting CHRONICLE_API_KEYS: Value error, api_keys entry 1 (counting from 0): an entry of "
        "tenant 'acme' is not 'tenant:sha256hex[:nkey|:read-only]': the digest is not 64 hex digits"
    ]


@pytest.mark.parametrize(
    "entry",
    ["acme:chr_live_SECRETPART", "chr_live_SECRETPART", "acme:" + "a" * 64 + ":chr_live_SECRETPART"],
    ids=["as-digest", "whole-entry", "as-nkey"],
)
def test_a_raw_key_pasted_as_an_api_keys_entry_is_not_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], entry: str
) -> None:
    """A raw API key pasted where its entry belongs would be printed by every process at start:
    the line names the entry's place (and its tenant, when it has one), never its text."""
    monkeypatch.setenv("CHRONICLE_API_KEYS", f'["{entry}"]')
    assert main(["api"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert "SECRETPART" not in err
    assert "api_keys entry 0 (counting from 0): an entry " in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValidationError) as refused:  # nor pydantic's own text, for any other caller
        Settings()
    assert "SECRETPART" not in str(refused.value)


def test_a_bad_line_of_the_api_keys_file_stops_the_process_with_the_file_and_line(tmp_path: Path) -> None:
    """``CHRONICLE_API_KEYS_FILE`` is checked as ``CHRONICLE_API_KEYS`` is: a process does not start
    on a file with a line that is not an entry (one line naming the file and the line number, never
    the line: a raw key pasted there), exit 2."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"# the tenants\n{api_key_entry('acme', 'chr_ok')}\n\nacme:chr_live_SECRETPART\n")
    done = _api(CHRONICLE_API_KEYS_FILE=str(keys))
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert done.stderr.strip() == (
        f"chronicle api: setting CHRONICLE_API_KEYS_FILE: {keys} line 4: an entry of tenant 'acme' is "
        "not 'tenant:sha256hex[:nkey|:read-only]': the digest is not 64 hex digits"
    )


def test_an_api_keys_file_that_cannot_be_read_stops_the_process_in_one_line(tmp_path: Path) -> None:
    done = _api(CHRONICLE_API_KEYS_FILE=str(tmp_path / "absent"))
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert done.stderr.strip() == (
        f"chronicle api: setting CHRONICLE_API_KEYS_FILE: {tmp_path / 'absent'} cannot be read "
        "(No such file or directory)"
    )


def test_the_api_keys_file_adds_to_the_env_entries(tmp_path: Path) -> None:
    """Both count: the file's entries after ``api_keys``', its path kept absolute (a child process in
    another directory reads the same file); blank lines and comments skipped."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"  # a comment\n\n{api_key_entry('acme', 'chr_file', read_only=True)}\n")
    settings = Settings(api_keys=[api_key_entry("beta", "chr_env")], api_keys_file=str(keys))
    assert settings.grants_by_key_hash() == {
        hash_key("chr_env"): KeyGrant("beta"),
        hash_key("chr_file"): KeyGrant("acme", read_only=True),
    }
    assert settings.api_keys_file == str(keys.resolve())
    keys.write_text(f"{api_key_entry('acme', 'chr_new')}\n")
    again = settings.with_keys_file_read()  # a reload: the file anew, the env's entries kept
    assert set(again.grants_by_key_hash()) == {hash_key("chr_env"), hash_key("chr_new")}
    assert set(settings.grants_by_key_hash()) == {hash_key("chr_env"), hash_key("chr_file")}  # left as it was


def _api(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "api"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("value", ["", "   "])
def test_a_blank_ops_key_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """``CHRONICLE_OPS_KEY=`` (a secret that was not filled in) was a key no client can send (an
    HTTP server strips a header's trailing blanks): /readyz and /metrics answered 401 to every
    probe and scrape for good. It is refused at start instead, as any setting that cannot be used."""
    monkeypatch.setenv("CHRONICLE_OPS_KEY", value)
    assert main(["api"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "chronicle api: setting CHRONICLE_OPS_KEY: Value error, a blank ops key: give one "
        "(`Authorization: Bearer <ops key>`), or leave CHRONICLE_OPS_KEY unset for open operator routes"
    ]


@pytest.mark.parametrize("value", [" chr_ops", "chr_ops\n", "\tchr_ops "])
def test_an_ops_key_with_surrounding_whitespace_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """An HTTP server strips a header's surrounding blanks: no probe could ever send such a key, so
    /readyz and /metrics would answer 401 for good. Refused at start, the key not shown."""
    monkeypatch.setenv("CHRONICLE_OPS_KEY", value)
    assert main(["api"]) == SETTINGS_EXIT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "chronicle api: setting CHRONICLE_OPS_KEY: Value error, the ops key starts or ends with whitespace, "
        "which no request can carry: remove it"
    ]
    assert "chr_ops" not in err


def test_settings_with_a_broken_keys_file_build_and_refuse_only_when_the_keys_are_asked_for(tmp_path: Path) -> None:
    """Every process builds settings; only those that use the tenant keys read the file (a
    projector's settings build with a file it never uses)."""
    keys = tmp_path / "api-keys"
    keys.write_text("acme:chr_live_SECRETPART\n")
    settings = Settings(api_keys_file=str(keys))
    assert settings.api_keys_file == str(keys.resolve())
    with pytest.raises(UnusableSetting, match=f"^{keys} line 1: ") as refused:
        settings.api_key_entries()
    assert "SECRETPART" not in str(refused.value)
    with pytest.raises(UnusableSetting):
        settings.grants_by_key_hash()
    keys.write_text(f"{api_key_entry('acme', 'chr_ok')}\n")
    assert settings.grants_by_key_hash() == {hash_key("chr_ok"): KeyGrant("acme")}  # read once it parses
