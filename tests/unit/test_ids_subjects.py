"""Id rules, subject-token encoding and the subject layout."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from events.ids import (
    MAX_MESSAGE_ID_LEN,
    MAX_SESSION_LEN,
    MAX_TENANT_LEN,
    InvalidId,
    check_message_id,
    check_new_message_id,
    check_session,
    check_tenant,
    decode_token,
    encode_token,
)
from events.subjects import DEFAULT_PREFIX, DEFAULT_STREAM, SubjectLayout, partition_of

Checker = Callable[[str], str]
CHECKERS: dict[str, tuple[Checker, int]] = {
    "tenant": (check_tenant, MAX_TENANT_LEN),
    "session": (check_session, MAX_SESSION_LEN),
    "message": (check_message_id, MAX_MESSAGE_ID_LEN),
    "new message": (check_new_message_id, MAX_MESSAGE_ID_LEN),
}

BAD_FOR_ALL = [
    "",
    "\x00",
    "a\x00b",
    "a\nb",
    "a\tb",
    "a\x7fb",
    "a\u200bb",  # zero-width space (format character)
    " a",
    "a ",
    "\u00a0a",  # no-break space
    "a\u3000",  # ideographic space
]


@pytest.mark.parametrize("kind", CHECKERS)
@pytest.mark.parametrize("value", ["a", "acme", "tenant-a", "T_1", "0"])
def test_plain_ids_are_accepted_everywhere(kind: str, value: str) -> None:
    check, _ = CHECKERS[kind]
    assert check(value) == value


@pytest.mark.parametrize("kind", CHECKERS)
def test_longest_id_is_accepted(kind: str) -> None:
    check, max_len = CHECKERS[kind]
    assert check("x" * max_len) == "x" * max_len


@pytest.mark.parametrize("kind", CHECKERS)
def test_too_long_id_is_rejected(kind: str) -> None:
    check, max_len = CHECKERS[kind]
    with pytest.raises(InvalidId, match="longer than"):
        check("x" * (max_len + 1))


@pytest.mark.parametrize("kind", CHECKERS)
@pytest.mark.parametrize("value", BAD_FOR_ALL, ids=ascii)
def test_bad_ids_are_rejected_everywhere(kind: str, value: str) -> None:
    check, _ = CHECKERS[kind]
    with pytest.raises(InvalidId):
        check(value)


def test_invalid_id_is_a_value_error() -> None:
    assert issubclass(InvalidId, ValueError)


@pytest.mark.parametrize("check", [check_session, check_message_id, check_new_message_id])
@pytest.mark.parametrize("value", ["chat 1", "a.b", "a*b>c", "会話-1", "~abc", "user@example.com", "🙂"])
def test_session_and_message_ids_allow_printable_characters(check: Checker, value: str) -> None:
    assert check(value) == value


@pytest.mark.parametrize("check", [check_session, check_message_id, check_new_message_id])
@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("a\u0001b", "U+0001, a control character"),
        ("👨\u200d👩", "U+200D, a format character"),  # a zero-width joiner (emoji sequences hold it)
        ("\ufeffid", "U+FEFF, a format character"),
        ("a\ue000", "U+E000, a private-use character"),
        ("a\U000f0000", "U+F0000, a private-use character"),
        ("a\u0378", "U+0378, an unassigned character"),
        ("a\ud800", "U+D800, a surrogate character"),
    ],
)
def test_an_id_refused_for_a_character_names_it_and_its_kind(check: Checker, value: str, named: str) -> None:
    """The refusal says which character and why (a joiner in an emoji id was 'control or
    unassigned', which it is not)."""
    with pytest.raises(InvalidId) as refused:
        check(value)
    assert named in str(refused.value)
    assert "no control, format, private-use, surrogate or unassigned characters" in str(refused.value)


@pytest.mark.parametrize("value", ["a/b", "/a", "a/", "/", "会話/1"])
def test_session_ids_must_not_hold_a_slash(value: str) -> None:
    with pytest.raises(InvalidId, match="'/'"):
        check_session(value)
    assert check_message_id(value) == value  # a stored message's id may hold one (an earlier release)


@pytest.mark.parametrize("value", ["a/b", "/a", "a/", "/", "会話/1", "a/..", "./."])
def test_a_new_message_id_must_not_hold_a_slash(value: str) -> None:
    with pytest.raises(InvalidId, match="must not contain '/'"):
        check_new_message_id(value)


@pytest.mark.parametrize("value", [".", ".."])
def test_a_new_message_id_must_not_be_a_dot_segment(value: str) -> None:
    with pytest.raises(InvalidId, match=f"must not be {value!r}"):
        check_new_message_id(value)
    assert check_message_id(value) == value


@pytest.mark.parametrize("value", ["...", ".a", "a.", "a..b", "a\\b", "a%2Fb"])
def test_a_new_message_id_may_hold_dots_and_other_punctuation(value: str) -> None:
    assert check_new_message_id(value) == value


@pytest.mark.parametrize("value", ["a.b", "a b", "a*", "a>", "~abc", "ünï", "a/b", "a:b"])
def test_tenant_ids_are_plain_only(value: str) -> None:
    with pytest.raises(InvalidId, match="letters, digits"):
        check_tenant(value)


# -- subject tokens -----------------------------------------------------------------------------

PLAIN = ["a", "acme", "tenant-a", "chat_1", "0123", "A-b_C", "x" * 128]
ODD = [
    "a.b",
    "a.b.c",
    ".",
    "*",
    ">",
    "a*",
    "a>",
    "chat.>",
    "a b",
    " a",
    "a\tb",
    "会話",
    "héllo wörld",
    "🙂",
    "~",
    "~abc",
    "~YS5i",
    "a~b",
    "a/b",
    "a=b",
    "会話." * 32,
]
TOKEN = re.compile(r"~?[A-Za-z0-9_-]+|~")


@pytest.mark.parametrize("value", PLAIN + ODD, ids=ascii)
def test_token_round_trip(value: str) -> None:
    assert decode_token(encode_token(value)) == value


@pytest.mark.parametrize("value", PLAIN)
def test_plain_ids_are_their_own_token(value: str) -> None:
    assert encode_token(value) == value
    assert decode_token(value) == value


@pytest.mark.parametrize("value", ODD, ids=ascii)
def test_odd_ids_are_encoded(value: str) -> None:
    token = encode_token(value)
    assert token.startswith("~")
    assert token != value


@pytest.mark.parametrize("value", PLAIN + ODD, ids=ascii)
def test_tokens_are_safe_subject_tokens(value: str) -> None:
    token = encode_token(value)
    assert token
    assert not set(token) & {".", "*", ">"}
    assert not any(ch.isspace() for ch in token)
    assert TOKEN.fullmatch(token)


def test_plain_and_encoded_never_collide() -> None:
    values = PLAIN + ODD
    tokens = [encode_token(v) for v in values]
    assert len(set(tokens)) == len(values)
    # the literal text of an encoded token is itself encoded again, never left as is
    encoded = encode_token("a.b")
    assert encoded == "~YS5i"
    assert encode_token(encoded) != encoded
    assert decode_token(encode_token(encoded)) == encoded
    assert encode_token("~abc") != "~abc"
    assert decode_token(encode_token("~abc")) == "~abc"


def test_known_encodings() -> None:
    assert encode_token("chat.1") == "~Y2hhdC4x"
    assert encode_token("会話") == "~5Lya6Kmx"


# -- subject layout -----------------------------------------------------------------------------


def nats_match(subject_filter: str, subject: str) -> bool:
    """NATS wildcard semantics: ``*`` is one token, ``>`` is one or more trailing tokens."""
    want, have = subject_filter.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def test_defaults() -> None:
    layout = SubjectLayout()
    assert (layout.stream, layout.prefix, layout.partitions) == (DEFAULT_STREAM, DEFAULT_PREFIX, 1)
    assert layout.wildcard == "chronicle.ev.>"


def test_session_subject_shape() -> None:
    layout = SubjectLayout(partitions=16)
    assert layout.session_subject("acme", "sess-1") == "chronicle.ev.acme.p007.sess-1"
    assert layout.session_subject("acme", "chat.1") == "chronicle.ev.acme.p015.~Y2hhdC4x"
    assert SubjectLayout().session_subject("acme", "sess-1") == "chronicle.ev.acme.p000.sess-1"


PAIRS = [
    ("acme", "sess-1"),
    ("acme", "chat.1"),
    ("tenant-a", "chat 1"),
    ("t", "会話 > 1"),
    ("t", "~abc"),
    ("t", "a.*.>"),
    ("weird.tenant", "s"),
]


@pytest.mark.parametrize("prefix", [DEFAULT_PREFIX, "t1a2b3c4.ev", "x"])
@pytest.mark.parametrize(("tenant", "session"), PAIRS)
def test_session_subject_parses_back(prefix: str, tenant: str, session: str) -> None:
    layout = SubjectLayout(prefix=prefix, partitions=16)
    subject = layout.session_subject(tenant, session)
    assert layout.parse(subject) == (tenant, session)
    assert len(subject.split(".")) == len(prefix.split(".")) + 3
    assert nats_match(layout.wildcard, subject)


@pytest.mark.parametrize(
    "subject",
    [
        "other.ev.acme.p000.s",
        "chronicle.evx.acme.p000.s",
        "chronicle.ev.acme.p000",
        "chronicle.ev.acme.p000.s.extra",
        "chronicle.ev",
    ],
)
def test_parse_rejects_foreign_subjects(subject: str) -> None:
    with pytest.raises(ValueError, match="subject"):
        SubjectLayout().parse(subject)


@pytest.mark.parametrize(("tenant", "session"), [p for p in PAIRS if p[0] != "weird.tenant"])
def test_a_work_subject_parses_back_to_its_session(tenant: str, session: str) -> None:
    layout = SubjectLayout(prefix="t1a2b3c4.ev")
    assert layout.work_session("compaction", layout.work_subject("compaction", tenant, session)) == (tenant, session)


@pytest.mark.parametrize(
    "subject",
    [
        "chronicle.ev-work.compaction.acme",  # no session
        "chronicle.ev-work.compaction.acme.s.extra",
        "chronicle.ev-work.other.acme.s",  # another kind of work
        "chronicle.ev.acme.p000.s",  # the log's, not the work queue's
        "chronicle.ev-work.compaction..s",  # an empty tenant
        "chronicle.ev-work.compaction.acme.=",  # the tenant scope: no session to compact
        "chronicle.ev-work.compaction.acme.~",  # an empty session
        "chronicle.ev-work.compaction.~@@.s",  # not base64url
        "chronicle.ev-work.compaction.~YWNtZQ.s",  # "acme" encoded: not the canonical token
        "chronicle.ev-work.compaction.~YSBi.s",  # "a b": no tenant id
        "chronicle.ev-work.compaction.acme.~_w",  # not UTF-8
        "chronicle.ev-work.compaction.acme.~ICA",  # whitespace only: no session id
    ],
)
def test_a_work_subject_that_names_no_session_is_refused(subject: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - InvalidId, UnicodeDecodeError and the layout's own
        SubjectLayout().work_session("compaction", subject)


def test_partition_is_stable() -> None:
    # computed once (CRC-32 of "tenant\0session"); a change here moves sessions between workers
    assert partition_of("acme", "sess-1", 16) == 7
    assert partition_of("acme", "sess-1", 1000) == 831
    assert partition_of("tenant-a", "chat 1", 8) == 2
    assert partition_of("acme", "chat.1", 16) == 15


def test_partition_separates_tenant_from_session() -> None:
    # the separator keeps ("ab", "c") and ("a", "bc") apart
    assert partition_of("ab", "c", 2**31) != partition_of("a", "bc", 2**31)


@pytest.mark.parametrize("partitions", [1, 2, 3, 16, 100, 1000])
def test_partition_is_in_range(partitions: int) -> None:
    seen = {partition_of("acme", f"session-{i}", partitions) for i in range(500)}
    assert seen <= set(range(partitions))
    if partitions <= 16:
        assert seen == set(range(partitions))


@pytest.mark.parametrize("partitions", [0, -1])
def test_partition_count_must_be_positive(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_of("acme", "s", partitions)


def test_partition_filter_matches_its_sessions_only() -> None:
    layout = SubjectLayout(partitions=8)
    assert layout.partition_filter(3) == "chronicle.ev.*.p003.*"
    for i in range(64):
        tenant, session = f"tenant-{i % 3}", f"chat.{i}"
        subject = layout.session_subject(tenant, session)
        mine = partition_of(tenant, session, 8)
        for part in range(8):
            assert nats_match(layout.partition_filter(part), subject) == (part == mine)


def test_nats_match_helper() -> None:
    assert nats_match("a.*.c", "a.b.c")
    assert not nats_match("a.*.c", "a.b.d")
    assert not nats_match("a.*", "a.b.c")
    assert nats_match("a.>", "a.b.c")
    assert not nats_match("a.>", "a")


def test_derived_ids_keep_the_ids_recorded_so_far() -> None:
    """Overlay, fork, skill and append ids are derived as they always were: a retry that spans an
    upgrade is still deduplicated."""
    import uuid

    from events.ids import derived_id

    assert derived_id("overlay", "t", "s", "m1", "m3") == str(
        uuid.uuid5(uuid.NAMESPACE_URL, "chronicle:overlay:t:s:m1:m3")
    )
    assert derived_id("append", "t", "s", "m", "h", None) == str(
        uuid.uuid5(uuid.NAMESPACE_URL, "chronicle:append:t:s:m:h:None")
    )
    assert derived_id("a", 1) != derived_id("b", 1)


def test_derived_ids_of_different_parts_differ_whatever_colons_and_backslashes_they_hold() -> None:
    from events.ids import derived_id

    assert derived_id("usage", "tenant-a", "s", "x:k") != derived_id("usage", "tenant-a", "s:x", "k")
    assert derived_id("a", "x\\", ":") != derived_id("a", "x\\:", "")
    assert derived_id("a", "x\\:y") != derived_id("a", "x", "y")
    assert len({derived_id("a", *p) for p in [("a:b", "c"), ("a", "b:c"), ("a", "b", "c"), ("a:b:c",)]}) == 4
