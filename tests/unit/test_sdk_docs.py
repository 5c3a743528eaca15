"""The SDK reference in docs/sdk.md is generated from the docstrings and must not be stale."""

from __future__ import annotations

import inspect

import chronicle_sdk
from chronicle_sdk import _docgen


def test_docs_sdk_md_is_up_to_date() -> None:
    assert _docgen.DOC_PATH.exists(), "run: python -m chronicle_sdk._docgen"
    assert _docgen.DOC_PATH.read_text(encoding="utf-8") == _docgen.render(), (
        "docs/sdk.md is stale: run python -m chronicle_sdk._docgen"
    )
    assert _docgen.main(["--check"]) == 0


def test_the_reference_covers_every_public_name() -> None:
    assert set(chronicle_sdk.__all__) <= _docgen.documented_names()


def test_every_public_function_and_method_has_a_docstring() -> None:
    missing: list[str] = []
    for name in chronicle_sdk.__all__:
        obj = getattr(chronicle_sdk, name)
        if inspect.isfunction(obj) and not obj.__doc__:
            missing.append(name)
        if inspect.isclass(obj):
            if not obj.__doc__:
                missing.append(name)
            for member, value in _docgen._members(obj):
                fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if not getattr(fn, "__doc__", None):
                    missing.append(f"{name}.{member}")
    assert missing == []


def test_every_public_value_is_described_with_its_whole_docstring() -> None:
    values = ["OMITTED", "Message", "Via", "Provider"]
    assert {n: bool(_docgen._describe_value(n)) for n in values} == dict.fromkeys(values, True)
    via = _docgen._describe_value("Via")  # a docstring of two lines, read whole
    assert [f'``"{path}"``' in via for path in ("http", "nats", "jetstream")] == [True] * 3
    assert via.endswith('(``"jetstream"``).')
