"""``chronicle erase --tenant default`` beside a ``chronicle up`` stack that made tenant
``default``'s key: that key is in no setting of the command (``up`` keeps it in its data dir and
gives it to its own processes), so the warning that the tenant can write again at once was never
printed while the stack served the key. ``up`` records the key's file in ``stack.json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.ops.erase_cli import keys_left
from services.settings import LocalStack, Settings

URL = "nats://127.0.0.1:18121"


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("API_KEYS", "API_KEYS_FILE", "NATS_URL", "DATA_DIR"):
        monkeypatch.delenv(f"CHRONICLE_{name}", raising=False)


def beside(data: Path) -> Settings:
    return Settings(data_dir=str(data)).with_local_stack()


def test_the_key_up_made_is_warned_of_beside_its_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_file = str(tmp_path / "api-key")
    LocalStack(URL, api_key_file=key_file).write(tmp_path)
    assert LocalStack.read(tmp_path) == LocalStack(URL, api_key_file=key_file)
    keys_left(beside(tmp_path), "default")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"chronicle erase: warning: tenant 'default' still has the API key `chronicle up` made for it ({key_file})"
    )


def test_no_warning_for_another_tenant_a_stack_that_made_no_key_or_another_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    LocalStack(URL, api_key_file=str(tmp_path / "api-key")).write(tmp_path)
    keys_left(beside(tmp_path), "acme")
    monkeypatch.setenv("CHRONICLE_NATS_URL", "nats://elsewhere:4222")  # not the stack's: its key is not served there
    keys_left(beside(tmp_path), "default")
    monkeypatch.delenv("CHRONICLE_NATS_URL")
    LocalStack(URL).write(tmp_path)  # keys configured: up made none
    keys_left(beside(tmp_path), "default")
    assert capsys.readouterr().err == ""
