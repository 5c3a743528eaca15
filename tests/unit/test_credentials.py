"""Tenant NATS identities derived from API keys, api_keys entries and the generated server config."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import SecretStr

from events.credentials import is_user_public_key, nkey_public_key, tenant_inbox_prefix, tenant_nkey_seed
from events.ids import encode_token
from events.subjects import SubjectLayout
from services.commands_nats.app import answerable
from services.ops.cli import SETTINGS_EXIT, main
from services.ops.natsconf import MissingOperator, NatsAccess, server_config
from services.settings import ApiKeyEntry, KeyGrant, Settings, api_key_entry, hash_key, new_api_key, new_operator_seed


def test_a_keys_nats_identity_is_stable_and_its_own() -> None:
    seed = tenant_nkey_seed("chr_one")
    assert seed.startswith("SU")
    assert seed == tenant_nkey_seed("chr_one")
    assert tenant_nkey_seed("chr_two") != seed
    assert is_user_public_key(nkey_public_key(seed))


def test_public_keys_are_checked() -> None:
    public = nkey_public_key(new_operator_seed())
    assert is_user_public_key(public)
    assert not is_user_public_key(public[:-1] + ("A" if public[-1] != "A" else "B"))  # checksum
    assert not is_user_public_key("A" + public[1:])  # an account key, not a user's
    assert not is_user_public_key("U")
    with pytest.raises(ValueError, match="not an NKey seed"):
        nkey_public_key("SUnot-a-seed")


def test_an_entry_carries_the_digest_and_the_nats_public_key() -> None:
    entry = ApiKeyEntry.parse(api_key_entry("acme", "chr_k"))
    assert entry == ApiKeyEntry("acme", hash_key("chr_k"), nkey_public_key(tenant_nkey_seed("chr_k")))
    assert ApiKeyEntry.parse(f"acme:{hash_key('x').upper()}") == ApiKeyEntry("acme", hash_key("x"), None)


def test_a_read_only_entry_has_no_nats_identity_and_grants_reads_only() -> None:
    entry = ApiKeyEntry.parse(api_key_entry("acme", "chr_ro", read_only=True))
    assert entry == ApiKeyEntry("acme", hash_key("chr_ro"), None, read_only=True)
    assert api_key_entry("acme", "chr_ro", read_only=True) == f"acme:{hash_key('chr_ro')}:read-only"
    settings = Settings(api_keys=[api_key_entry("acme", "chr_full"), api_key_entry("acme", "chr_ro", read_only=True)])
    assert settings.grants_by_key_hash() == {
        hash_key("chr_full"): KeyGrant("acme", read_only=False),  # an entry without a scope stays a full key
        hash_key("chr_ro"): KeyGrant("acme", read_only=True),
    }
    assert settings.tenant_nkeys() == {"acme": [nkey_public_key(tenant_nkey_seed("chr_full"))]}


def test_keygen_read_only_prints_a_key_and_its_read_only_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", "--tenant", "acme", "--read-only"]) == 0
    out = capsys.readouterr().out
    key = out.split("API key (read-only: no writes, no data keys, no NATS identity): ")[1].split()[0]
    assert f"CHRONICLE_API_KEYS='[\"acme:{hash_key(key)}:read-only\"]'" in out
    assert "NATS seed" not in out
    assert main(["keygen", "--operator", "--read-only"]) == 2


@pytest.mark.parametrize("extra", [[], ["--read-only"]], ids=["full", "read-only"])
def test_keygen_prints_the_bare_entry_to_add_first_and_the_whole_assignment_only_for_a_first_key(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A second team's pasted ``CHRONICLE_API_KEYS='[…]'`` replaced the first's keys: the entry
    comes first, alone and said to be added to the list; the assignment is labelled a first key's."""
    assert main(["keygen", "--tenant", "acme", *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    key = lines[0].rsplit(": ", 1)[1]
    entry = api_key_entry("acme", key, read_only=bool(extra))
    [at] = [i for i, line in enumerate(lines) if line.endswith(f": {entry}")]
    assert lines[at] == f"CHRONICLE_API_KEYS entry (add it to the existing list, keeping the entries there): {entry}"
    [assignment] = [i for i, line in enumerate(lines) if "CHRONICLE_API_KEYS='" in line]
    assert assignment > at
    assert lines[assignment] == f"a first key only (no CHRONICLE_API_KEYS set yet): CHRONICLE_API_KEYS='[\"{entry}\"]'"


@pytest.mark.parametrize("tenant", ["bad name", "", "t" * 65, "ténant"])
def test_keygen_for_a_tenant_that_is_no_tenant_id_is_one_line_and_exit_2(tenant: str) -> None:
    """As a process, as it is run: one line that names the tenant and the rule, no traceback, no key."""
    done = subprocess.run(
        [sys.executable, "-m", "services.ops.cli", "keygen", "--tenant", tenant],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == SETTINGS_EXIT, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"chronicle keygen: --tenant {tenant[:80]!r}: tenant id ")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("acme", "digest"),
        (f"a.b:{'a' * 64}", "tenant id"),
        (f"acme:{'g' * 64}", "digest"),
        (f"acme:{'a' * 64}:UNOPE", "NKey"),
        (f"{api_key_entry('acme', 'k')}:extra", "NKey"),
        (f"acme:{'a' * 64}:read-only:extra", "NKey"),
        (f"acme:{'a' * 64}:readonly", "NKey"),
    ],
)
def test_a_malformed_entry_is_refused(entry: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ApiKeyEntry.parse(entry)


def test_the_server_config_lists_the_operator_and_each_tenant_key_with_its_own_subjects() -> None:
    op = new_operator_seed()
    settings = Settings(
        nats_nkey_seed=SecretStr(op),
        partitions=2,
        subject_prefix="c.ev",
        api_keys=[
            api_key_entry("acme", "k1"),
            api_key_entry("acme", "k2"),
            f"http-only:{'a' * 64}",
            api_key_entry("acme", "k3", read_only=True),  # no user: it can neither publish nor send commands
        ],
    )
    config = server_config(NatsAccess.of(settings), host="127.0.0.1", port=4222, store_dir="/d")
    users = config["authorization"]["users"]
    assert "no_auth_user" not in config
    assert "accounts" not in config
    assert users[0] == {
        "nkey": nkey_public_key(op),
        "permissions": {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}},
    }
    assert [u["nkey"] for u in users[1:]] == sorted(nkey_public_key(tenant_nkey_seed(k)) for k in ("k1", "k2"))
    assert users[1]["permissions"] == {
        "publish": {"allow": ["c.ev.acme.p000.*", "c.ev.acme.p001.*", "chronicle.cmd.acme.>"]},
        "subscribe": {"allow": [f"{tenant_inbox_prefix('acme')}.>"]},
    }
    assert SubjectLayout(prefix="c.ev", partitions=2).session_subject("acme", "s").startswith("c.ev.acme.p00")


def test_no_config_without_an_operator_identity() -> None:
    with pytest.raises(MissingOperator, match="keygen --operator"):
        NatsAccess.of(Settings(nats_nkey_seed=None))


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("", False),  # none: how a publish ack another tenant reflected there arrives
        ("_INBOX_T.tenant-a.nuid.1", True),
        ("_INBOX_T.tenant-a", False),  # the prefix itself, not under it
        ("_INBOX_T.tenant-ab.nuid.1", False),  # another tenant's inbox that starts alike
        ("_INBOX_T.tenant-b.nuid.1", False),
        ("t.ev.tenant-b.p000.s1", False),  # another tenant's event subject
        ("_INBOX.nuid.1", True),  # the operator's own clients' default inbox: no tenant may listen there
        ("_INBOX", False),
        ("_INBOXES.nuid.1", False),
    ],
)
def test_the_command_service_answers_only_under_the_requesters_inbox(reply_to: str, expected: bool) -> None:
    assert answerable(encode_token("tenant-a"), reply_to) is expected


@pytest.mark.parametrize("first", ["key", "seed"])
def test_an_entry_whose_first_field_is_a_key_or_a_seed_is_refused_without_naming_it(first: str) -> None:
    """(Fields pasted in the wrong order, `<key>:acme`, were refused naming the key as the entry's
    tenant, in a process's exit line and the API's reload log; `<key>:<64 hex>` was taken, a key
    of tenant `chr_…`.)"""
    secret = new_api_key() if first == "key" else new_operator_seed()
    for entry in (f"{secret}:acme", f"{secret}:{'a' * 64}"):
        with pytest.raises(ValueError, match="no tenant id before") as refused:
            ApiKeyEntry.parse(entry)
        assert secret not in str(refused.value)
