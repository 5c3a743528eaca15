"""Render the SDK's API reference (``docs/sdk.md``) from its public signatures and docstrings.

::

    python -m chronicle_sdk._docgen            # (re)write docs/sdk.md
    python -m chronicle_sdk._docgen --check    # exit 1 if docs/sdk.md is stale

A unit test runs the check, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import chronicle_sdk
from chronicle_sdk import config, connection, convert, errors
from events import omitted

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "sdk.md"

SECTIONS: list[tuple[str, ModuleType | None, list[str]]] = [
    ("Client", None, ["ChronicleClient", "Via"]),
    ("Sessions", None, ["Session", "SessionManager", "Connection"]),
    ("Context providers", config, ["Readonly", "ObjectSource", "Writable", "Searchable", "Skills", "Provider"]),
    ("Tools", None, ["Tools", "ToolDefinition", "format_session_search"]),
    ("Converters", convert, ["to_openai_messages", "to_anthropic_messages", "UnconvertibleMessage"]),
    (
        "Values",
        None,
        [
            "OMITTED",
            "Message",
            "AppendResult",
            "RecentHistory",
            "HistoryRowStat",
            "SessionInfo",
            "ErasureInfo",
            "SearchResult",
            "ContextBlock",
            "SystemPrompt",
            "Compaction",
            "CompactionFailure",
            "NatsPublishing",
        ],
    ),
]


def _doc(obj: Any) -> str:
    doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
    return inspect.cleandoc(doc) if doc else ""


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value
    return inspect.formatannotation(value)


def _signature(fn: Callable[..., Any], *, skip_self: bool) -> str:
    sig = inspect.signature(fn)
    parts: list[str] = []
    seen_kw_only = False
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not seen_kw_only:
            parts.append("*")
            seen_kw_only = True
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        if p.kind is p.VAR_POSITIONAL:
            seen_kw_only = True
        text = prefix + p.name
        ann = _annotation(p.annotation)
        if ann:
            text += f": {ann}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if ann else f"={p.default!r}"
        parts.append(text)
    ret = _annotation(sig.return_annotation)
    return f"({', '.join(parts)})" + (f" -> {ret}" if ret else "")


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public members defined by ``cls`` or its SDK bases, bases first, in source order."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("chronicle_sdk"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, staticmethod | classmethod | property) or inspect.isfunction(value):
                seen[name] = value
    yield from seen.items()


def _member(name: str, value: Any) -> list[str]:
    if isinstance(value, property):
        ret = _annotation(inspect.signature(value.fget).return_annotation) if value.fget else ""
        head = f"#### `{name}` *(property)*" + (f" → `{ret}`" if ret else "")
        return [head, "", _doc(value.fget) if value.fget else "", ""]
    fn = value.__func__ if isinstance(value, staticmethod | classmethod) else value
    kind = (
        "classmethod " if isinstance(value, classmethod) else "staticmethod " if isinstance(value, staticmethod) else ""
    )
    prefix = "async " if inspect.iscoroutinefunction(fn) else ""
    sig = _signature(fn, skip_self=not isinstance(value, staticmethod))
    return [f"#### `{kind}{prefix}{name}`", "", "```python", f"{prefix}def {name}{sig}", "```", "", _doc(fn), ""]


def _class(name: str, cls: type) -> list[str]:
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    lines = [f"### class `{name}`" + (f"({', '.join(bases)})" if bases else ""), ""]
    if "__init__" in vars(cls) and not getattr(cls, "_is_protocol", False):  # a Protocol's is typing's
        lines += ["```python", f"{name}{_signature(vars(cls)['__init__'], skip_self=True)}", "```", ""]
    lines += [_doc(cls), ""]
    for member_name, value in _members(cls):
        lines += _member(member_name, value)
    return lines


def _item(name: str) -> list[str]:
    obj = getattr(chronicle_sdk, name)
    if inspect.isclass(obj):
        return _class(name, obj)
    if inspect.isfunction(obj):
        prefix = "async " if inspect.iscoroutinefunction(obj) else ""
        return [
            f"### `{prefix}{name}`",
            "",
            "```python",
            f"{prefix}def {name}{_signature(obj, skip_self=False)}",
            "```",
        ]
    return [f"### `{name}`", "", "```python", f"{name} = {obj!r}", "```", ""]


def _describe_value(name: str) -> str:
    docs = {
        "OMITTED": _doc_attr(omitted, "OMITTED"),
        "Message": _doc_attr(chronicle_sdk.types, "Message"),
        "Via": _doc_attr(connection, "Via"),
        "Provider": "Any of the providers above.",
    }
    return docs.get(name, "")


def _doc_attr(module: ModuleType, name: str) -> str:
    """The docstring written under a module-level assignment (read from the source), all of its
    lines."""
    source = inspect.getsource(module).splitlines()
    for i, line in enumerate(source):
        if line.startswith((f"{name}: ", f"{name} = ")):
            for j, follow in enumerate(source[i + 1 : i + 4], start=i + 1):
                if follow.startswith('"""'):
                    text = follow[3:]
                    while '"""' not in text and j + 1 < len(source):
                        j += 1
                        text += "\n" + source[j]
                    return text.split('"""', 1)[0]
    return ""


def _errors() -> list[str]:
    lines = [
        "## Errors",
        "",
        _doc(errors),
        "",
        "| exception | base | problem `code` |",
        "|---|---|---|",
    ]
    classes = [getattr(chronicle_sdk, n) for n in chronicle_sdk.__all__]
    for cls in classes:
        if inspect.isclass(cls) and issubclass(cls, errors.ChronicleError):
            base = cls.__bases__[0].__name__ if cls is not errors.ChronicleError else "Exception"
            lines.append(f"| `{cls.__name__}` | `{base}` | `{cls.default_code}` |")
    return [*lines, ""]


def render() -> str:
    """The whole reference as Markdown."""
    out = [
        "<!-- Generated by `python -m chronicle_sdk._docgen` from the SDK's docstrings; do not edit. -->",
        "",
        "# Chronicle Python SDK reference",
        "",
        _doc(chronicle_sdk),
        "",
    ]
    for title, module, names in SECTIONS:
        out += [f"## {title}", ""]
        if module is not None:
            out += [_doc(module), ""]
        for name in names:
            out += _item(name)
            extra = _describe_value(name)
            if extra:
                out += [extra, ""]
            if inspect.isfunction(getattr(chronicle_sdk, name)):
                out += ["", _doc(getattr(chronicle_sdk, name)), ""]
    out += _errors()
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"


def documented_names() -> set[str]:
    """Every public name the reference covers (the test checks it covers ``__all__``)."""
    names = {n for _, _, ns in SECTIONS for n in ns}
    names |= {
        n
        for n in chronicle_sdk.__all__
        if inspect.isclass(getattr(chronicle_sdk, n)) and issubclass(getattr(chronicle_sdk, n), errors.ChronicleError)
    }
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/sdk.md from the SDK's docstrings.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else None
    if args.check:
        if current != text:
            print(f"{DOC_PATH} is stale: run python -m chronicle_sdk._docgen", file=sys.stderr)
            return 1
        return 0
    DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOC_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
