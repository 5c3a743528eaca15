"""The fingerprint of the tenant keys in force, in the reload lines of `chronicle api` and `chronicle
up` (and the API's start line): equal where two processes serve the same keys, different when one
entry differs, and never the keys or their digests."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from services.api.keyring import KeyRing
from services.ops.localstack import KeysReload
from services.ops.natsconf import NatsAccess
from services.settings import KeyGrant, Settings, api_key_entry, grants_fingerprint, hash_key, new_operator_seed

GRANTS = {hash_key("chr_a"): KeyGrant("acme"), hash_key("chr_b"): KeyGrant("beta", read_only=True)}


def test_the_fingerprint_is_equal_for_equal_grants_whatever_their_order() -> None:
    again = dict(reversed(list(GRANTS.items())))
    assert grants_fingerprint(again) == grants_fingerprint(GRANTS)
    assert len(grants_fingerprint(GRANTS)) == 12
    assert all(ch in "0123456789abcdef" for ch in grants_fingerprint(GRANTS))


@pytest.mark.parametrize(
    "changed",
    [
        {hash_key("chr_a"): KeyGrant("acme"), hash_key("chr_c"): KeyGrant("beta", read_only=True)},  # another key
        {hash_key("chr_a"): KeyGrant("other"), hash_key("chr_b"): KeyGrant("beta", read_only=True)},  # its tenant
        {hash_key("chr_a"): KeyGrant("acme"), hash_key("chr_b"): KeyGrant("beta")},  # no longer read-only
        {hash_key("chr_a"): KeyGrant("acme")},  # one removed
        {},
    ],
    ids=["digest", "tenant", "read-only", "removed", "none"],
)
def test_the_fingerprint_differs_when_one_entry_changes(changed: dict[str, KeyGrant]) -> None:
    assert grants_fingerprint(changed) != grants_fingerprint(GRANTS)


def test_the_api_and_up_log_the_same_fingerprint_for_the_same_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "api-keys"
    keys_file.write_text(f"{api_key_entry('acme', 'chr_a')}\n")
    settings = Settings(
        nats_nkey_seed=new_operator_seed(), api_keys=[api_key_entry("beta", "chr_b")], api_keys_file=str(keys_file)
    )
    expected = grants_fingerprint(settings.grants_by_key_hash())
    ring = KeyRing(settings.grants_by_key_hash())
    assert ring.fingerprint == expected
    with caplog.at_level(logging.INFO, logger="chronicle.keys"):
        assert ring.reload(settings)
    assert f"api keys reloaded: 1 entries from {keys_file}, keys fingerprint {expected}" in caplog.text
    up = KeysReload(settings, NatsAccess.of(settings))
    up.ask(signal.SIGHUP, None)
    assert up.reload([])
    out = capsys.readouterr().out
    assert f"chronicle up: api keys reloaded: 1 entries from {keys_file}, keys fingerprint {expected} (" in out
    assert "chr_a" not in caplog.text + out
    assert hash_key("chr_a") not in caplog.text + out  # nor the digests
