"""``chronicle up --help`` names the settings that shape the stack it runs (its API port, its
database, its S3 are environment variables, not options) and where every setting is documented."""

from __future__ import annotations

import re
from pathlib import Path

from services.ops.up_help import UP_SETTINGS
from services.settings import Settings
from tests.unit.test_cli_refusals import chronicle

README = Path(__file__).resolve().parents[2] / "README.md"


def test_up_help_names_the_environment_settings_that_shape_the_stack() -> None:
    """(It showed --nats-port, --nats-cluster and --api-processes only.)"""
    done = chronicle("up", "--help")
    assert (done.returncode, done.stderr) == (0, "")
    for name in ("CHRONICLE_API_PORT", "CHRONICLE_S3_ENDPOINT", "CHRONICLE_DATABASE_URL", "CHRONICLE_DATA_DIR"):
        assert name in done.stdout, done.stdout
    assert "CHRONICLE_API_PORT (default 8080)" in done.stdout
    assert "--s3-port N" in done.stdout  # the local S3's port, an option (the endpoint stays a setting)
    assert "Every setting: README.md, section Settings" in done.stdout
    assert all(len(line) <= 100 for line in done.stdout.splitlines()), done.stdout


def test_each_setting_up_help_names_is_a_setting_the_readme_documents() -> None:
    section = README.read_text(encoding="utf-8").split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    for name, _ in UP_SETTINGS:
        assert name in Settings.model_fields, name
        assert re.search(rf"`{name.upper()}`", section), name


def test_up_help_says_listed_keys_are_used_alone() -> None:
    """`up` adds tenant default's key only where no key is configured; its help said a keys file's
    entries came with the data dir's key for tenant default (an SRE trial read it so)."""
    what = dict(UP_SETTINGS)["api_keys_file"]
    assert "is added" not in what, what
    assert "used alone" in what, what
