"""The search syntax: words, quoted phrases, prefixes; nothing a user types raises."""

from __future__ import annotations

import pytest

from projections.search_query import MAX_PARTS, Part, match_sql, parse


def test_words_are_parts_in_order_without_duplicates() -> None:
    assert parse("the  Deploy the friday") == [
        Part("phrase", "the"),
        Part("phrase", "Deploy"),
        Part("phrase", "friday"),
    ]


def test_quoted_phrases_and_unclosed_quotes() -> None:
    assert parse('stack "blue   green" now') == [
        Part("phrase", "stack"),
        Part("phrase", "blue green"),
        Part("phrase", "now"),
    ]
    assert parse('a "blue green') == [Part("phrase", "a"), Part("phrase", "blue green")]
    assert parse('"" "!?"') == []


def test_trailing_star_is_a_prefix_of_the_last_token() -> None:
    assert parse("deplo*") == [Part("prefix", "deplo")]
    assert parse("blue-gre*") == [Part("phrase", "blue"), Part("prefix", "gre")]
    assert parse("here:*") == [Part("prefix", "here")]
    assert parse("* ** -*") == []


def test_a_word_with_punctuation_stays_one_part() -> None:
    assert parse("blue-green it's") == [Part("phrase", "blue-green"), Part("phrase", "it's")]


@pytest.mark.parametrize("query", ["", "   ", "&|!():*", "'\"", "\\", "--", "__"])
def test_nothing_searchable_gives_no_parts(query: str) -> None:
    assert parse(query) == []


def test_long_queries_are_cut_to_the_first_parts() -> None:
    parts = parse(" ".join(f"w{i}" for i in range(100)))
    assert len(parts) == MAX_PARTS
    assert parts[0] == Part("phrase", "w0")


def test_user_text_never_enters_the_sql() -> None:
    sql = match_sql(parse("x'); DROP TABLE messages; -- y*"))
    assert "DROP" not in sql
    assert sql.count("%(p") == 5  # x, DROP, TABLE, messages and the prefix y; "--" has no word
