"""The API keys one API process accepts, replaced whole when it reloads them (SIGHUP).

A reload reads ``api_keys_file`` again (``api_keys`` kept as given at start) and, when every entry
parses, swaps the grants in one assignment: a request looks its key up once, in the grants it
found, so a request in flight is never judged by a mix of the old keys and the new. A file that
does not read or parse changes nothing: the previous keys stay, and one ERROR line says why.
The INFO lines give the keys' fingerprint (:func:`grants_fingerprint`): every process serving the
same keys shows the same one."""

from __future__ import annotations

import logging

from services.settings import KeyGrant, Settings, UnusableSetting, grants_fingerprint

log = logging.getLogger("chronicle.keys")


class KeyRing:
    """What each key (by its SHA-256) may do, as last loaded."""

    def __init__(self, grants: dict[str, KeyGrant]) -> None:
        self.grants = grants

    def grants_to(self, digest: str, tenant: str) -> bool:
        """Whether the key of SHA-256 ``digest`` is still one of ``tenant``'s (read-only or full):
        what an answer opened with it before a reload asks, to go on."""
        grant = self.grants.get(digest)
        return grant is not None and grant.tenant == tenant

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the keys in force."""
        return grants_fingerprint(self.grants)

    def reload(self, settings: Settings) -> bool:
        """Read ``settings``' key file again; True when the keys were swapped. Without a key file
        there is nothing to read: the keys stay, with a warning."""
        if settings.api_keys_file is None:
            log.warning(
                "api keys not reloaded: no CHRONICLE_API_KEYS_FILE is set (CHRONICLE_API_KEYS is read at start)"
            )
            return False
        try:
            fresh = settings.with_keys_file_read()
        except UnusableSetting as exc:
            log.error("api keys not reloaded, the previous keys stay in force: %s", exc)
            return False
        self.grants = fresh.grants_by_key_hash()  # one assignment: each request sees the old grants or the new
        log.info(
            "api keys reloaded: %d entries from %s, keys fingerprint %s",
            fresh.file_entry_count(),
            settings.api_keys_file,
            self.fingerprint,
        )
        return True
