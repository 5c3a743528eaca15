"""Stream and subject layout: ``<prefix>.<tenant>.p<NN>.<session>``, one stream for all events;
commands (requests answered over core NATS, never stored) at ``<commands>.<tenant>.<command>``.

The partition token is a stable hash of (tenant, session) so a session always lands in the same
partition: projector workers can split partitions while each session stays in order.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from events.ids import check_session, check_tenant, decode_token, encode_token

DEFAULT_STREAM = "CHRONICLE"
DEFAULT_PREFIX = "chronicle.ev"
DEFAULT_COMMANDS = "chronicle.cmd"


def partition_of(tenant: str, session: str, partitions: int) -> int:
    """The partition (0-based) of a session; stable across processes and releases."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return zlib.crc32(f"{tenant}\x00{session}".encode()) % partitions


@dataclass(frozen=True, slots=True)
class SubjectLayout:
    """Where events live: the stream name, the subject prefix and the partition count; and the
    prefix of the command subjects (outside the stream's: a request is never stored)."""

    stream: str = DEFAULT_STREAM
    prefix: str = DEFAULT_PREFIX
    partitions: int = 1
    commands: str = DEFAULT_COMMANDS

    def __post_init__(self) -> None:
        if self.commands == self.prefix or self.commands.startswith(self.prefix + "."):
            raise ValueError(f"command subjects ({self.commands!r}) must lie outside the stream's ({self.prefix!r})")

    def command_subject(self, tenant: str, command: str) -> str:
        """Where ``tenant`` sends ``command`` (a request; the reply is the answer)."""
        return f"{self.commands}.{encode_token(tenant)}.{command}"

    def command_filter(self, tenant: str) -> str:
        """Every command subject of ``tenant``."""
        return f"{self.commands}.{encode_token(tenant)}.>"

    @property
    def commands_ping(self) -> str:
        """Where the operator asks whether a ``chronicle commands`` answers (readiness): under the
        command prefix, on a token no tenant's can be (``$`` is neither plain nor base64url), so
        outside every tenant's command subjects, which are all a tenant may publish to."""
        return f"{self.commands}.$ping"

    @property
    def wildcard(self) -> str:
        return f"{self.prefix}.>"

    @property
    def work_stream(self) -> str:
        """The work-queue stream beside the log (compaction requests): retention ``workqueue``."""
        return f"{self.stream}_WORK"

    @property
    def work_prefix(self) -> str:
        """Subjects of :attr:`work_stream`: outside :attr:`wildcard` (streams may not overlap) and
        outside every tenant's publish permissions."""
        return f"{self.prefix}-work"

    def work_subject(self, kind: str, tenant: str, session: str) -> str:
        """One subject per session and kind of work: the stream keeps the newest request of each."""
        return f"{self.work_prefix}.{kind}.{encode_token(tenant)}.{encode_token(session)}"

    def work_session(self, kind: str, subject: str) -> tuple[str, str]:
        """(tenant, session) of a work subject of ``kind``: exactly :meth:`work_subject`'s form
        (canonical tokens) for a valid tenant id and a valid session id (not the tenant scope);
        else :class:`ValueError`. Whatever lands on such a subject concerns that session only."""
        head = f"{self.work_prefix}.{kind}."
        tokens = subject[len(head) :].split(".") if subject.startswith(head) else []
        if len(tokens) != 2:
            raise ValueError(f"subject {subject!r} is not a {kind} work subject")
        tenant, session = check_tenant(decode_token(tokens[0])), check_session(decode_token(tokens[1]))
        if self.work_subject(kind, tenant, session) != subject:
            raise ValueError(f"subject {subject!r} is not in canonical form")
        return tenant, session

    def session_subject(self, tenant: str, session: str) -> str:
        part = partition_of(tenant, session, self.partitions)
        return f"{self.prefix}.{encode_token(tenant)}.p{part:03d}.{encode_token(session)}"

    def tenant_filter(self, tenant: str) -> str:
        """Every session subject of ``tenant``."""
        return f"{self.prefix}.{encode_token(check_tenant(tenant))}.*.*"

    def partition_filter(self, partition: int) -> str:
        """Subject filter for one partition across all tenants."""
        return f"{self.prefix}.*.p{partition:03d}.*"

    def partition_token(self, subject: str) -> int | None:
        """The partition whose filter (:meth:`partition_filter`) ``subject`` matches, from the
        subject's own token (not recomputed from the ids); None when no partition's does."""
        head = self.prefix + "."
        tokens = subject[len(head) :].split(".") if subject.startswith(head) else []
        if len(tokens) != 3 or not tokens[1].startswith("p") or not tokens[1][1:].isdigit():
            return None
        part = int(tokens[1][1:])
        return part if part < self.partitions and tokens[1] == f"p{part:03d}" else None

    def placed(self, subject: str) -> bool | None:
        """Whether a session subject is the one this layout gives its tenant and session (its
        partition token is this partition count's); None for a subject that names no session."""
        try:
            tenant, session = self.parse(subject)
            return self.session_subject(tenant, session) == subject
        except ValueError:
            return None

    def parse(self, subject: str) -> tuple[str, str]:
        """(tenant, session) of a session subject."""
        head = self.prefix + "."
        if not subject.startswith(head):
            raise ValueError(f"subject {subject!r} is not under {self.prefix!r}")
        tokens = subject[len(head) :].split(".")
        if len(tokens) != 3:
            raise ValueError(f"subject {subject!r} does not have the session layout")
        return decode_token(tokens[0]), decode_token(tokens[2])
