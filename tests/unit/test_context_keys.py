"""Keys of keyed writes (pure): title slug, content slug + FNV-1a over UTF-16 in base 36.

The expected values were computed with the reference's algorithm in JavaScript (``node``); the
last test re-runs that JavaScript when ``node`` is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from services.context.entry_keys import base36, context_entry_key, fnv1a_utf16, hash36, slugify

# (title, content) -> key, as the reference computes it (checked with node, see below)
CASES: list[tuple[str | None, str, str]] = [
    ("Pirate style", "Arr", "pirate-style"),
    (None, "no key", "no-key-1nprufp"),
    (None, "just content no desc", "just-content-no-desc-6i3pfm"),
    ("日本語のタイトル", "x", "entry-o8sg2e"),
    (None, "これは内容です", "entry-13jm95p"),
    (None, "🏴\u200d☠️ pirate", "pirate-19tl3w6"),
    (None, "", "entry-ztntfp"),
    ("   ", "blank title", "blank-title-1vt35vn"),
    # blank as JavaScript's trim sees it: U+FEFF, U+3000, U+00A0 are; U+001C and U+0085 are not
    ("\ufeff", "bom test", "bom-test-1fge2yn"),
    ("\u3000 \u00a0", "bom test", "bom-test-1fge2yn"),
    ("\u001c", "bom test", "entry-6y7dzv"),
    ("\u0085", "bom test", "entry-zj08u8"),
    ("İ" * 70, "c", "-".join(["i"] * 60)),
    (
        None,
        "The quick brown fox jumps over the lazy dog and keeps running far away 1",
        "the-quick-brown-fox-jumps-over-the-lazy-dog-and-keeps-runnin-q45ptm",
    ),
    (
        None,
        "The quick brown fox jumps over the lazy dog and keeps running far away 2",
        "the-quick-brown-fox-jumps-over-the-lazy-dog-and-keeps-runnin-pu644n",
    ),
    ("😀😀😀", "c", "entry-150m628"),
    (None, "😀", "entry-1kdnhdk"),
    (
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 tail",
        "c",
        "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz01234567",
    ),
    ("--Hello, World!--", "c", "hello-world"),
    (None, "Ünïcödé wörds", "n-c-d-w-rds-mdlwyy"),
]

JS = r"""
function hash(s){let h=0x811c9dc5; for(let i=0;i<s.length;i++){h^=s.charCodeAt(i); h=Math.imul(h,0x01000193);}
  return (h>>>0).toString(36);}
function slugify(s){return s.slice(0,60).toLowerCase().replace(/[^a-z0-9]+/g,"-").replace(/^-+|-+$/g,"");}
function key(t,c){ if (t && t.trim()) return slugify(t) || `entry-${hash(t)}`;
  return `${slugify(c)||"entry"}-${hash(c)}`;}
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(cases.map(([t,c]) => key(t,c))));
"""


@pytest.mark.parametrize(("title", "content", "key"), CASES, ids=[c[2][:30] for c in CASES])
def test_context_entry_key(title: str | None, content: str, key: str) -> None:
    assert context_entry_key(title, content) == key


def test_title_slug_and_content_keys_from_the_reference_tests() -> None:
    assert context_entry_key("Pirate style", "Talk like a pirate") == "pirate-style"
    assert re.fullmatch(r"no-key-[a-z0-9]+", context_entry_key(None, "no key"))
    assert re.fullmatch(r"just-content-no-desc-[a-z0-9]+", context_entry_key(None, "just content no desc"))
    assert re.fullmatch(r"entry-[a-z0-9]+", context_entry_key("日本語のタイトル", "content"))
    assert re.fullmatch(r"entry-[a-z0-9]+", context_entry_key(None, "これは内容です"))


def test_the_title_wins_over_the_content_and_is_stable() -> None:
    assert context_entry_key("Deploy notes", "v1") == context_entry_key("Deploy notes", "v2 entirely different")
    assert context_entry_key("", "abc") == context_entry_key(None, "abc")


def test_similar_long_contents_get_different_keys() -> None:
    base = "Remember that the customer prefers email over phone calls for all follow ups "
    a, b = context_entry_key(None, base + "A"), context_entry_key(None, base + "B")
    assert a != b
    assert a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0]  # same 60-char slug, different hash


def test_slug_cuts_60_utf16_units_before_lowercasing() -> None:
    # "İ".lower() is two code points ("i" + U+0307): lowercasing first would keep only 30 of them
    assert slugify("İ" * 70) == "-".join(["i"] * 60)
    assert slugify("a" * 59 + "😀" + "b") == "a" * 59  # the cut falls inside the surrogate pair
    assert slugify("a" * 61) == "a" * 60
    assert slugify("!!!") == ""


def test_fnv1a_over_utf16_code_units() -> None:
    assert fnv1a_utf16("") == 0x811C9DC5
    assert fnv1a_utf16("a") == 0xE40C292C  # the published FNV-1a 32 test vector
    assert fnv1a_utf16("foobar") == 0xBF9CF968
    # a non-BMP character hashes as its two surrogates, not as one code point or UTF-8 bytes
    assert hash36("😀") == "1kdnhdk"
    assert base36(0) == "0"
    assert base36(35) == "z"
    assert base36(36) == "10"
    assert base36(0xFFFFFFFF) == "1z141z3"


def test_lone_surrogate_is_hashed_like_javascript() -> None:
    # node: hash("a\ud83d") === "4tj8ar"; fix: encode("utf-16-le", "surrogatepass") in keys.py
    assert context_entry_key(None, "a\ud83d") == "a-4tj8ar"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_keys_agree_with_the_reference_javascript() -> None:
    cases = [[t, c] for t, c, _ in CASES]
    done = subprocess.run(
        ["node", "-e", JS], input=json.dumps(cases), capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(done.stdout) == [k for _, _, k in CASES]
    assert [context_entry_key(t, c) for t, c, _ in CASES] == json.loads(done.stdout)
