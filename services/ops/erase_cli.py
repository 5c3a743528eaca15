"""``chronicle erase`` and ``chronicle keys``: erasure and key-encryption-key rotation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from events.catalog import MAX_ERASURE_REASON
from events.context import is_bucket_name
from events.ids import TENANT_SCOPE
from projections.keystore import new_kek_line
from services.bootstrap import open_container
from services.errors import SessionNotFound
from services.ops.localstack import DEFAULT_TENANT
from services.settings import LocalStack, Settings
from services.terminal import safe_json, safe_text

CLI_REQUESTER = "operator (chronicle erase)"
"""``requested_by`` of an erasure made with this command."""


def bucket_refusal(buckets: list[str], session: str | None) -> str | None:
    """Why ``--bucket`` is refused (None: it is not)."""
    if buckets and session is not None:
        return "--bucket goes with a whole tenant (no --session)"
    bad = [b for b in buckets if not is_bucket_name(b)]
    return f"--bucket {bad[0][:100]!r} is not an S3 bucket name" if bad else None


def keys_left(settings: Settings, tenant: str) -> None:
    """Warn (stderr, one line) when ``tenant``, whole, is erased while it still has API key entries
    in the settings: it can write again at once, under new session ids (docs/security.md, Erasing a
    tenant: its keys go first)."""
    count = sum(1 for entry in settings.api_key_entries() if entry.tenant == tenant)
    stack = LocalStack.read(Path(settings.data_dir))
    if stack is not None and stack.api_key_file and tenant == DEFAULT_TENANT and stack.nats_url == settings.nats_url:
        # the key `chronicle up` made is in no setting of this command: the stack beside it serves it
        print(
            f"chronicle erase: warning: tenant {tenant!r} still has the API key `chronicle up` made for it "
            f"({stack.api_key_file}), served by the stack beside this command: it can write again as soon as it is "
            "erased; start `chronicle up` again with CHRONICLE_API_KEYS or CHRONICLE_API_KEYS_FILE set (it then "
            "makes no key) first (docs/security.md, Erasing a tenant)",
            file=sys.stderr,
            flush=True,
        )
    if count:
        print(
            f"chronicle erase: warning: tenant {tenant!r} still has {count} API key entr{'y' if count == 1 else 'ies'} "
            "in CHRONICLE_API_KEYS or CHRONICLE_API_KEYS_FILE: it can write again as soon as it is erased; remove them "
            "(SIGHUP the API for the file, and reload nats-server for its NATS users) first (docs/security.md, "
            "Erasing a tenant)",
            file=sys.stderr,
            flush=True,
        )


async def run_erase(settings: Settings, args: argparse.Namespace) -> int:
    """Erase one session (``--session``) or, with ``--yes``, every session of the tenant and its
    tenant-level entries; prints one JSON line per session erased. A session that does not exist
    exits 1 (nothing recorded), and so does a tenant with nothing to erase (a mistyped name:
    :meth:`~services.writes.erasure.Eraser.tenant_exists`); a whole tenant without ``--yes``
    prints what would be erased and exits 1. ``--reason`` (at most 500 characters, no NUL; else
    exit 2, nothing erased) is recorded with each erasure, ``requested_by`` is ``operator
    (chronicle erase)``. ``--bucket`` (a whole tenant's) adds buckets to clean to those Chronicle
    knows hold the tenant's objects; the dry run lists each bucket with its objects. A tenant
    erased but for buckets the store refused (named on the tenant scope's line,
    ``buckets_not_cleaned``, and on stderr) exits 4: run it again once they can be cleaned. The
    stream is never created here: there is nothing to erase in a log that is not."""
    reason: str | None = getattr(args, "reason", None)
    if reason is not None and (len(reason) > MAX_ERASURE_REASON or "\x00" in reason):
        print(f"chronicle erase: --reason: at most {MAX_ERASURE_REASON} characters, no NUL", file=sys.stderr)
        return 2
    buckets: list[str] = list(getattr(args, "bucket", None) or [])
    refused = bucket_refusal(buckets, args.session)
    if refused is not None:
        print(f"chronicle erase: {refused}", file=sys.stderr)
        return 2
    async with open_container(settings, create_stream=False) as c:
        reserved = sorted(set(buckets) & c.context.reserved_buckets)
        if reserved:
            print(f"chronicle erase: --bucket {reserved[0]!r} is Chronicle's own, no tenant's", file=sys.stderr)
            return 2
        eraser = c.eraser
        if args.session is not None:
            try:
                done = [
                    await eraser.erase_session(args.tenant, args.session, requested_by=CLI_REQUESTER, reason=reason)
                ]
            except SessionNotFound:
                print(
                    f"chronicle erase: no session {args.session!r} of tenant {args.tenant!r} (no event in the log, "
                    "no data key): nothing erased",
                    file=sys.stderr,
                )
                return 1
        elif not await eraser.tenant_exists(args.tenant, buckets):
            print(
                f"chronicle erase: no tenant {args.tenant!r} (no session, data key, skill document or event): "
                "nothing erased",
                file=sys.stderr,
            )
            return 1
        elif not args.yes:
            keys_left(settings, args.tenant)
            sessions = await eraser.tenant_sessions(args.tenant)
            gone = await eraser.erased_sessions(args.tenant)
            for session in sessions:
                if session == TENANT_SCOPE:
                    print("would erase: the tenant-level entries")
                else:
                    print(f"{'already erased' if session in gone else 'would erase'}: {session!r}")
            for held in await eraser.tenant_objects(args.tenant, buckets):
                if held.refused is not None:
                    print(
                        f"cannot delete: objects under tenants/{args.tenant}/ in bucket {held.bucket!r}: the store "
                        f"refuses it ({safe_text(held.refused)})"
                    )
                else:
                    print(
                        f"would delete: {held.objects} objects under tenants/{args.tenant}/ in bucket {held.bucket!r}"
                    )
            count = sum(1 for session in sessions if session != TENANT_SCOPE and session not in gone)
            already = sum(1 for session in sessions if session != TENANT_SCOPE and session in gone)
            print(
                f"not erased: erasing tenant {args.tenant!r} destroys every session listed ({count}"
                f"{f'; {already} already erased, not counted' if already else ''}), its tenant-level "
                "entries and the objects listed for good. Run again with --yes to erase."
            )
            return 1
        else:
            keys_left(settings, args.tenant)
            done = await eraser.erase_tenant(args.tenant, requested_by=CLI_REQUESTER, reason=reason, buckets=buckets)
        left = [b for erased in done for b in erased.buckets_not_cleaned]
        for erased in done:
            line: dict[str, object] = {"tenant": args.tenant, "session": erased.session, "seq": erased.seq}
            line |= {"newly_erased": erased.newly_erased, "objects_deleted": erased.objects_deleted}
            if erased.buckets_not_cleaned:
                line["buckets_not_cleaned"] = [
                    {"bucket": b.bucket, "reason": b.reason} for b in erased.buckets_not_cleaned
                ]
            sys.stdout.write(safe_json(line) + "\n")
        if left:
            for b in left:
                print(
                    f"chronicle erase: not deleted: objects under tenants/{args.tenant}/ in bucket {b.bucket!r}: "
                    f"{safe_text(b.reason)}",
                    file=sys.stderr,
                )
            print(
                f"chronicle erase: tenant {args.tenant!r} is erased but for the buckets above: its erasure is not "
                "complete until they are cleaned; run it again once the credentials can list and delete there",
                file=sys.stderr,
            )
            return 4  # as object storage that cannot be used (services/ops/cli.py UNREACHABLE_EXIT)
    return 0


async def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    if args.keys_command == "new-kek":
        print(new_kek_line())
        return 0
    async with open_container(settings, create_stream=False) as c:  # the data keys alone: the log is not written
        print(f"rewrapped {await c.keys.rewrap()} data keys under {c.keys.kek_id}")
    return 0
