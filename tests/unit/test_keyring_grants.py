"""What a followed answer asks the key ring at each tick: is the key it was opened with still its
tenant's? A reload that removed the key, or gave it to another tenant, ends it; one that made it
read-only does not (a read-only key may follow)."""

from __future__ import annotations

from services.api.keyring import KeyRing
from services.settings import KeyGrant, hash_key

DIGEST = hash_key("chr_follower")


def test_a_key_still_granted_to_its_tenant_goes_on_read_only_or_full() -> None:
    ring = KeyRing({DIGEST: KeyGrant("acme")})
    assert ring.grants_to(DIGEST, "acme")
    ring.grants = {DIGEST: KeyGrant("acme", read_only=True)}  # a reload made it read-only
    assert ring.grants_to(DIGEST, "acme")


def test_a_key_removed_or_given_to_another_tenant_does_not() -> None:
    ring = KeyRing({DIGEST: KeyGrant("acme")})
    ring.grants = {hash_key("chr_other"): KeyGrant("acme")}  # removed
    assert not ring.grants_to(DIGEST, "acme")
    ring.grants = {DIGEST: KeyGrant("beta")}  # now another tenant's
    assert not ring.grants_to(DIGEST, "acme")
