"""Token counts (services/tokens.py): exact for text that has word starts, counted in bounded pieces
where it has none, so that no text holds a process for seconds (a 1.7 MB run of one character
took 1.1-1.7 s counted whole)."""

from __future__ import annotations

import itertools
import random

import pytest

from services.tokens import FORCED, WINDOW, TokenCounter, encoding, pieces, word_start

COUNTER = TokenCounter()
ENC = encoding("cl100k_base")
WORDS = ["hello", "world", "the", "Deploy", "naïve", "日本語", "x=1;", "don't", "it's", "123", "4567", "...", "É"]
GAPS = [" ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", " - "]


def prose(n: int, seed: int) -> str:
    """About ``n`` characters of text with word starts throughout, numbers, contractions,
    punctuation, accents, CJK and runs of whitespace."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        part = rng.choice(WORDS) + rng.choice(GAPS)
        out.append(part)
        size += len(part)
    return "".join(out)


@pytest.mark.parametrize("seed", range(8))
def test_text_with_word_starts_counts_exactly_as_tiktoken_whole(seed: int) -> None:
    text = prose(3 * WINDOW + 777 * seed, seed)
    assert len(pieces(text)) > 1  # counted in pieces
    assert COUNTER.count(text) == len(ENC.encode_ordinary(text))


def test_special_token_text_is_counted_as_ordinary_text() -> None:
    text = "<|endoftext|> and " * 1000
    assert COUNTER.count(text) == len(ENC.encode(text, disallowed_special=()))


def test_pieces_join_to_the_text_and_are_cut_where_a_space_starts_a_word() -> None:
    text = prose(5 * WINDOW, 11)
    found = pieces(text)
    assert "".join(found) == text
    assert all(len(p) <= WINDOW for p in found)
    for before, after in itertools.pairwise(found):
        assert after[0] == " ", after[:5]
        assert after[1].isalpha(), after[:5]
        assert not before[-1].isspace(), before[-5:]


@pytest.mark.parametrize("run", ["a", ".", " ", "\n", "漢", "_."])
def test_a_run_without_word_starts_is_counted_in_short_pieces(run: str) -> None:
    text = run * (20 * WINDOW // len(run))
    found = pieces(text)
    assert "".join(found) == text
    assert max(len(p) for p in found[:-1]) <= FORCED  # no long piece to merge (the rest: at most a window)
    assert len(found[-1]) <= WINDOW
    exact = len(ENC.encode_ordinary(text))
    assert abs(COUNTER.count(text) - exact) <= len(found)  # within a token or so a cut


def test_a_long_run_inside_prose_is_cut_in_short_pieces_and_the_prose_exactly() -> None:
    head, tail = prose(2 * WINDOW, 3), prose(2 * WINDOW, 4)
    text = head + "=" * (10 * WINDOW) + tail
    found = pieces(text)
    assert "".join(found) == text
    run = [p for p in found if p.strip("=") == ""]
    assert len(run) >= 10 * WINDOW // FORCED - 4  # the run's 40,960 characters, less what its ends share
    assert all(len(p) <= FORCED for p in run)  # the run: short pieces
    assert COUNTER.count(head) == len(ENC.encode_ordinary(head))


def test_short_text_is_one_piece() -> None:
    assert pieces("hello world") == ["hello world"]
    assert COUNTER.count("") == 0
    assert COUNTER.count("hello world") == len(ENC.encode_ordinary("hello world"))


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ab cd", 2),  # a space after a non-space, before a letter
        ("ab  cd", None),  # after a space: tiktoken's whitespace piece would straddle the cut
        ("ab 12", None),  # before a digit
        ("ab .x", None),  # before punctuation
        ("ab c", 2),
        ("ab ", None),  # nothing after it
    ],
)
def test_word_start_is_a_space_between_a_non_space_and_a_letter(text: str, found: int | None) -> None:
    assert word_start(text, 0, len(text)) == found
