"""Micro-compaction, pure: the reference's structure-preserving tool-output truncation, read-time
truncation of older messages, write-time row-size enforcement and the byte-budgeted recent window.

Everything here measures the way the reference (JavaScript) does, so the outputs match it byte for
byte: sizes are lengths of ``JSON.stringify`` output (:func:`stringify`) counted in UTF-16 code
units (:func:`js_len`), or UTF-8 bytes of it for row sizes (:func:`json_bytes`); object keys are
walked in JavaScript's own order (integer-like keys first, ascending, then insertion order).

Nothing is mutated: every function returns new containers where it changes something and passes
unchanged values through by reference.

Deliberate differences from the reference, each in a place its behaviour is an accident of
JavaScript rather than a rule:

- A cut never falls between the two halves of a surrogate pair (an emoji, say): the cut moves one
  code unit earlier. JavaScript would leave a lone surrogate, which Postgres ``jsonb`` and UTF-8
  encoders reject; the result here is never longer than the reference's.
- A ``"__proto__"`` key of an over-budget object is kept. JavaScript's assignment to it sets the
  prototype of the copy instead, silently dropping the field.
- Python integers are written exactly; JavaScript would first round ones beyond 2**53 to a double.

Reference: the Cloudflare Agents SDK Session API, §4.4 (read time) and §4.5 (row size on write) of docs/reference.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, TypeAlias

JsonValue: TypeAlias = Any
Message: TypeAlias = dict[str, Any]

ROW_MAX_BYTES = 1_800_000
ROW_TOOL_OUTPUT_MAX_CHARS = 1000
ROW_TEXT_MAX_CHARS = 1000
ROW_TEXT_PREVIEW_CHARS = 500
DEFAULT_KEEP_RECENT = 4
DEFAULT_MAX_TOOL_OUTPUT_CHARS = 500
DEFAULT_MAX_TEXT_CHARS = 10_000
MAX_DEPTH = 8
TRUNCATED_FLAG = "__truncated"
TRUNCATED_CHARS = "__truncatedChars"
OMITTED_NOTE = "Tool output omitted because it was too large to preserve structurally."
COMPACTED_TOOL_OUTPUTS = "compactedToolOutputs"
COMPACTED_TEXT_PARTS = "compactedTextParts"

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]{0,9}")
_DIGIT_KEY = re.compile("\x00[0-9]")
_MAX_ARRAY_INDEX = 2**32 - 2


# -- JavaScript string and JSON semantics ---------------------------------------------------


def js_len(s: str) -> int:
    """``s.length`` in JavaScript: UTF-16 code units (a character beyond U+FFFF counts 2)."""
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def js_prefix(s: str, end: int) -> str:
    """``s.slice(0, end)`` in JavaScript (a negative ``end`` counts from the end), except that a
    surrogate pair is never split: the cut then moves one code unit earlier."""
    if s.isascii():
        return s[:end] if end >= 0 else s[: max(len(s) + end, 0)]
    units = s.encode("utf-16-le", "surrogatepass")
    total = len(units) // 2
    stop = min(end, total) if end >= 0 else max(total + end, 0)
    if 0 < stop < total and 0xD800 <= int.from_bytes(units[2 * stop - 2 : 2 * stop], "little") <= 0xDBFF:
        low = int.from_bytes(units[2 * stop : 2 * stop + 2], "little")
        if 0xDC00 <= low <= 0xDFFF:
            stop -= 1
    return units[: 2 * stop].decode("utf-16-le", "surrogatepass")


def _join_pair(m: re.Match[str]) -> str:
    high, low = ord(m.group()[0]), ord(m.group()[1])
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))


def _quote(s: str) -> str:
    # json's own encoder (ensure_ascii off) escapes exactly what JSON.stringify does: ", \, \b \f \n
    # \r \t, other C0 as \u00xx, nothing else (not "/", DEL or U+2028/2029). But it writes surrogate
    # code points raw, where JavaScript sees a high+low pair as one character and escapes a lone
    # half as \udxxx.
    quoted = encode_basestring(s)
    if s.isascii() or _SURROGATE.search(quoted) is None:
        return quoted
    quoted = _SURROGATE_PAIR.sub(_join_pair, quoted)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _number(x: float) -> str:
    """ECMAScript Number::toString for a finite double (NaN and infinities are JSON null)."""
    if math.isnan(x) or math.isinf(x):
        return "null"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    text = repr(abs(x))  # shortest round-tripping digits, as JavaScript chooses them
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        body = "0." + "0" * -n + digits
    else:
        e = n - 1
        body = f"{digits[0]}{'.' + digits[1:] if k > 1 else ''}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + body


def _is_array_index(key: str) -> bool:
    return _ARRAY_INDEX.fullmatch(key) is not None and int(key) <= _MAX_ARRAY_INDEX


def js_items(obj: dict[str, JsonValue]) -> list[tuple[str, JsonValue]]:
    """``Object.entries(obj)``: integer-like keys first in ascending order, then insertion order."""
    items = list(obj.items())
    # One C-speed pass finds whether any key starts with a digit (it also rejects non-string keys).
    if not obj or _DIGIT_KEY.search("\x00" + "\x00".join(obj)) is None:
        return items
    indexed = sorted((kv for kv in items if _is_array_index(kv[0])), key=lambda kv: int(kv[0]))
    return indexed if len(indexed) == len(items) else indexed + [kv for kv in items if not _is_array_index(kv[0])]


def _write(value: JsonValue, out: list[str]) -> None:
    kind = type(value)
    if kind is str:
        out.append(_quote(value))
    elif kind is dict:
        sep = "{"
        for key, item in js_items(value):
            sub = type(item)
            if sub is str:
                out.append(f"{sep}{_quote(key)}:{_quote(item)}")
            elif sub is int:
                out.append(f"{sep}{_quote(key)}:{item}")
            else:
                out.append(f"{sep}{_quote(key)}:")
                _write(item, out)
            sep = ","
        out.append("{}" if sep == "{" else "}")
    elif kind is list or kind is tuple:
        sep = "["
        for item in value:
            sub = type(item)
            if sub is str:
                out.append(sep + _quote(item))
            elif sub is int:
                out.append(f"{sep}{item}")
            else:
                out.append(sep)
                _write(item, out)
            sep = ","
        out.append("[]" if sep == "[" else "]")
    elif isinstance(value, dict):  # subclasses of the containers
        _write(dict(value), out)
    elif isinstance(value, list | tuple):
        _write(list(value), out)
    else:
        out.append(_scalar(value))


def _scalar(value: JsonValue) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _number(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def stringify(value: JsonValue) -> str:
    """``JSON.stringify(value)``: no whitespace, non-ASCII written as is, JavaScript's escapes,
    number formatting and key order."""
    out: list[str] = []
    _write(value, out)
    return "".join(out)


def json_bytes(value: JsonValue) -> int:
    """UTF-8 bytes of ``JSON.stringify(value)``: the reference's stored row size."""
    return len(stringify(value).encode("utf-8"))


def _length(value: JsonValue) -> int:
    """The reference's ``stringifyForLength(value).length``: a string counts as itself."""
    return js_len(value) if isinstance(value, str) else js_len(stringify(value))


# -- truncateToolOutput ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TruncatedToolOutput:
    output: JsonValue
    truncated: bool
    original_length: int


def truncated_suffix(original_length: int) -> str:
    return f"... [truncated {original_length} chars]"


def tool_output_truncation(value: JsonValue, max_chars: int) -> TruncatedToolOutput:
    """The reference's ``truncateToolOutput``: the value itself when its JSON fits ``max_chars``,
    else a structure-preserving truncation, with whether it was cut and the original length."""
    original = _length(value)
    if original <= max_chars:
        return TruncatedToolOutput(value, False, original)
    return TruncatedToolOutput(_truncate_value(value, max_chars, 0, original), True, original)


def truncate_tool_output(value: JsonValue, max_chars: int) -> JsonValue:
    """Structure-preserving truncation of a tool output to about ``max_chars`` of JSON."""
    return tool_output_truncation(value, max_chars).output


# The reference passes each value's original JSON length down with it; it only shows up in
# markers, so here it is measured when a marker needs it (``None`` until then).


def _truncate_value(value: JsonValue, max_chars: int, depth: int, original_length: int | None = None) -> JsonValue:
    if isinstance(value, str):
        return _truncate_string(value, max_chars, js_len(value))
    if not isinstance(value, dict | list | tuple):
        return value
    if depth >= MAX_DEPTH:
        length = _length(value) if original_length is None else original_length
        return f"[Nested output omitted {truncated_suffix(length)}]"
    if isinstance(value, dict):
        return _truncate_object(value, max_chars, depth, original_length)
    return _truncate_array(value, max_chars, depth, original_length)


def _child_max_chars(max_chars: int, child_count: int) -> int:
    if child_count <= 1:
        return max_chars
    return max(80, max_chars // min(child_count, 10))


def _truncate_array(
    value: Sequence[JsonValue], max_chars: int, depth: int, original_length: int | None
) -> list[JsonValue]:
    budget = _child_max_chars(max_chars, len(value))
    result = [_truncate_value(item, budget, depth + 1) for item in value]
    # Lengths by arithmetic: the reference re-serialises the whole array on every pop.
    sizes = [js_len(stringify(item)) for item in result]
    total = 2 + sum(sizes) + max(len(sizes) - 1, 0)
    while len(result) > 1 and total > max_chars:
        result.pop()
        total -= sizes.pop() + 1
    if len(result) == len(value) and total <= max_chars:
        return result
    original = _length(value) if original_length is None else original_length
    if len(result) < len(value):
        marker = f"Array output truncated {truncated_suffix(original)}"
        total += js_len(marker) + 2 + (1 if result else 0)
        result.append(marker)
    if total > max_chars:
        return _compact_array_marker(max_chars, original)
    return result


def _truncate_object(
    value: dict[str, JsonValue], max_chars: int, depth: int, original_length: int | None
) -> dict[str, JsonValue]:
    entries = js_items(value)
    budget = _child_max_chars(max_chars, len(entries))
    result = {key: _truncate_value(item, budget, depth + 1) for key, item in entries}
    result_length = _length(result)
    if result_length <= max_chars:
        return result
    length = _shrink_string_fields(result, result_length, max_chars)
    if length > max_chars:
        length = _assign(result, length, TRUNCATED_FLAG, True)
        length = _assign(result, length, TRUNCATED_CHARS, result_length)
    if length > max_chars:
        return _compact_object_marker(max_chars, _length(value) if original_length is None else original_length)
    return result


def _assign(obj: dict[str, JsonValue], length: int, key: str, item: JsonValue) -> int:
    """``obj[key] = item``, returning the object's new JSON length from its old one."""
    if key in obj:
        length -= js_len(stringify(obj[key]))
    else:
        length += js_len(_quote(key)) + 1 + (1 if obj else 0)
    obj[key] = item
    return length + js_len(stringify(item))


def _shrink_string_fields(value: dict[str, JsonValue], length: int, max_chars: int) -> int:
    """Cut the longest string fields (longest first, ties in key order) to a quarter of the budget
    until the object fits; returns its new serialised length."""
    strings = [(key, item) for key, item in js_items(value) if isinstance(item, str)]
    strings.sort(key=lambda kv: -js_len(kv[1]))  # stable, like Array.prototype.sort
    for key, text in strings:
        if length <= max_chars:
            break
        cut = _truncate_string(text, max(0, max_chars // 4), js_len(text))
        value[key] = cut
        length += js_len(_quote(cut)) - js_len(_quote(text))
    return length


def _truncate_string(value: str, max_chars: int, original_length: int) -> str:
    if js_len(value) <= max_chars:
        return value
    suffix = truncated_suffix(original_length)
    if max_chars <= len(suffix):
        return js_prefix(suffix, max_chars)
    return js_prefix(value, max_chars - len(suffix)) + suffix


def _compact_object_marker(max_chars: int, original_length: int) -> dict[str, JsonValue]:
    marker: dict[str, JsonValue] = {TRUNCATED_FLAG: True, TRUNCATED_CHARS: original_length, "note": OMITTED_NOTE}
    if _length(marker) <= max_chars:
        return marker
    return {TRUNCATED_FLAG: True, TRUNCATED_CHARS: original_length}


def _compact_array_marker(max_chars: int, original_length: int) -> list[JsonValue]:
    structured = _compact_object_marker(max_chars, original_length)
    if _length([structured]) <= max_chars:
        return [structured]
    marker: list[JsonValue] = [
        f"Array output omitted because it was too large to preserve structurally {truncated_suffix(original_length)}"
    ]
    if _length(marker) <= max_chars:
        return marker
    return [js_prefix(truncated_suffix(original_length), max_chars)]


# -- truncateOlderMessages (read time) ------------------------------------------------------


def _parts(message: Message) -> list[JsonValue]:
    parts = message.get("parts")
    return parts if isinstance(parts, list) else []


def _is_tool_part(part: dict[str, JsonValue]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def truncate_older_messages(
    messages: list[Message],
    keep_recent: int = DEFAULT_KEEP_RECENT,
    max_tool_output_chars: int = DEFAULT_MAX_TOOL_OUTPUT_CHARS,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> list[Message]:
    """The reference's ``truncateOlderMessages``: all but the last ``keep_recent`` messages get
    their tool outputs truncated structurally and long text parts cut.

    Returns ``messages`` itself when it has at most ``keep_recent`` messages, else a new list in
    which recent and unchanged messages are the input objects and changed ones are copies.
    Reasoning parts and the legacy ``result`` field are left alone.
    """
    if len(messages) <= keep_recent:
        return messages
    cutoff = len(messages) - keep_recent
    result: list[Message] = []
    for i, message in enumerate(messages):
        if i >= cutoff:
            result.append(message)
            continue
        changed = False
        parts: list[JsonValue] = []
        for part in _parts(message):
            new_part = part
            if isinstance(part, dict):
                new_part = _truncate_older_part(part, max_tool_output_chars, max_text_chars)
            changed = changed or new_part is not part
            parts.append(new_part)
        result.append({**message, "parts": parts} if changed else message)
    return result


def _truncate_older_part(part: dict[str, JsonValue], max_tool_output: int, max_text: int) -> dict[str, JsonValue]:
    if _is_tool_part(part) and "output" in part:
        cut = tool_output_truncation(part["output"], max_tool_output)
        if cut.truncated:
            return {**part, "output": cut.output}
    text = part.get("text")
    if part.get("type") == "text" and isinstance(text, str):
        length = js_len(text)
        if length > max_text:
            return {**part, "text": f"{js_prefix(text, max_text)}... [truncated {length} chars]"}
    return part


# -- enforceRowSizeLimit (write time) -------------------------------------------------------


def _spread(value: JsonValue) -> dict[str, JsonValue]:
    """``{...value}`` for the metadata merge: objects copy, arrays and strings by index."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return {str(i): item for i, item in enumerate(value)}
    if isinstance(value, str):
        units = value.encode("utf-16-le", "surrogatepass")
        return {str(i): units[2 * i : 2 * i + 2].decode("utf-16-le", "surrogatepass") for i in range(len(units) // 2)}
    return {}


def _with_metadata(message: Message, key: str, ids: list[JsonValue]) -> Message:
    return {**message, "metadata": {**_spread(message.get("metadata")), key: ids}}


def enforce_row_size_limit(message: Message, max_bytes: int = ROW_MAX_BYTES) -> tuple[Message, bool]:
    """The reference's ``enforceRowSizeLimit``: fit a message's JSON into ``max_bytes`` UTF-8 bytes.

    An assistant message first has every finished tool output (``output``, ``toolCallId`` and
    ``state == "output-available"``) truncated structurally to 1000 chars, the call ids listed in
    ``metadata.compactedToolOutputs``; if that is not enough, and for any other role, text parts
    over 1000 chars are replaced by a preview, oldest first, until it fits, their indices listed in
    ``metadata.compactedTextParts``. Returns the (possibly new) message and whether anything was
    cut; when nothing could be cut the input comes back, still over the cap (like the reference,
    whose copy is then equal to it).
    """
    if json_bytes(message) <= max_bytes:
        return message, False
    result = message
    if message.get("role") == "assistant":
        compacted: list[JsonValue] = []
        parts: list[JsonValue] = []
        for part in _parts(message):
            if (
                isinstance(part, dict)
                and "output" in part
                and "toolCallId" in part
                and part.get("state") == "output-available"
            ):
                cut = tool_output_truncation(part["output"], ROW_TOOL_OUTPUT_MAX_CHARS)
                if cut.truncated:
                    compacted.append(part["toolCallId"])
                    parts.append({**part, "output": cut.output})
                    continue
            parts.append(part)
        if compacted:
            result = _with_metadata({**message, "parts": parts}, COMPACTED_TOOL_OUTPUTS, compacted)
            if json_bytes(result) <= max_bytes:
                return result, True
    truncated = _truncate_text_parts(result, max_bytes)
    return truncated, truncated is not message


def _truncate_text_parts(message: Message, max_bytes: int) -> Message:
    indices: list[JsonValue] = []
    parts = list(_parts(message))
    for i, part in enumerate(parts):
        text = part.get("text") if isinstance(part, dict) else None
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(text, str)):
            continue
        length = js_len(text)
        if length <= ROW_TEXT_MAX_CHARS:
            continue
        indices.append(i)
        preview = js_prefix(text, ROW_TEXT_PREVIEW_CHARS)
        parts[i] = {**part, "text": f"[Text truncated for storage ({length} chars). First 500 chars: {preview}...]"}
        # As in the reference, the check leaves out the compactedTextParts added below.
        if json_bytes({**message, "parts": parts}) <= max_bytes:
            break
    if not indices:
        return message
    return _with_metadata({**message, "parts": parts}, COMPACTED_TEXT_PARTS, indices)


# -- getRecentHistory's window --------------------------------------------------------------


def recent_window(rows: Iterable[tuple[str, int]], max_bytes: int, min_recent: int = 1) -> tuple[int, bool, int]:
    """The reference's ``getRecentHistory`` window over a path's ``(id, stored bytes)`` rows,
    root first: ``(start index, truncated, total bytes of the whole path)``.

    The leaf is always in; the window grows backwards while it holds fewer than
    ``max(1, floor(min_recent))`` rows or the previous row still fits the remaining budget.
    ``truncated`` means it does not start at the root.
    """
    sizes = [size for _, size in rows]
    if not sizes:
        return 0, False, 0
    floor = max(1, math.floor(min_recent))
    start = len(sizes) - 1
    used = sizes[start]
    while start > 0 and (len(sizes) - start < floor or used + sizes[start - 1] <= max_bytes):
        start -= 1
        used += sizes[start]
    return start, start > 0, sum(sizes)
