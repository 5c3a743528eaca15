"""A command line the CLI refuses is one line on stderr, ``<prog>: <error>``, exit 2, nothing on
stdout: the top-level parser's refusals and its subcommands' alike (argparse printed its usage line
first). The CLI runs as a process; it refuses before reading any setting."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.ops.cli import SETTINGS_EXIT


def chronicle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``chronicle <args>`` as a process (with ``env`` alone as its environment, when given)."""
    return subprocess.run(
        [sys.executable, "-m", "services.ops.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["archive", "--bogus"], "chronicle archive: unrecognized arguments: --bogus"),
        (["verify", "--bogus"], "chronicle verify: unrecognized arguments: --bogus"),
        (["quarantine", "list", "--bogus", "x"], "chronicle quarantine list: unrecognized arguments: --bogus x"),
        (["--bogus", "verify"], "chronicle: unrecognized arguments: --bogus"),
        (
            ["quarantine", "list", "--limit", "0"],
            "chronicle quarantine list: argument --limit: must be at least 1 (given 0)",
        ),
        (["erase"], "chronicle erase: the following arguments are required: --tenant"),
        (
            ["stream-replicas", "9"],
            "chronicle stream-replicas: argument N: invalid choice: 9 (choose from 1, 2, 3, 4, 5)",
        ),
        (
            ["replay", "--session", "s1", "--from-seq", "0"],
            "chronicle replay: argument --from-seq: must be at least 1 (given 0)",
        ),
        (
            ["replay", "--session", "s1", "--to-seq", "-1"],
            "chronicle replay: argument --to-seq: must be at least 1 (given -1)",
        ),
        (  # an empty range: nothing printed and exit 0, as for a session without events there
            ["replay", "--session", "s1", "--from-seq", "30", "--to-seq", "10"],
            "chronicle replay: argument --to-seq: must be at least --from-seq 30 (given 10)",
        ),
        (
            ["history", "--session", "s1", "--as-of-seq", "-3"],
            "chronicle history: argument --as-of-seq: must be at least 0 (given -3)",
        ),
        (
            ["history", "--session", "s1", "--as-of-seq", "x"],
            "chronicle history: argument --as-of-seq: not a whole number: 'x'",
        ),
        (  # these were tracebacks (events.ids.InvalidId), raised once connected
            ["replay", "--session", "a/b"],
            "chronicle replay: argument --session: session id must not contain '/'",
        ),
        (
            ["history", "--session", "s1", "--tenant", "acme corp"],
            "chronicle history: argument --tenant: tenant id may only contain letters, digits, '_' and '-'",
        ),
        (
            ["skills", "put", "--bucket", "bk1", "--key", "skills/k", "--tenant", "bad tenant", "/dev/null"],
            "chronicle skills put: argument --tenant: tenant id may only contain letters, digits, '_' and '-'",
        ),
        (
            ["quarantine", "list", "--tenant", "acme.eu"],
            "chronicle quarantine list: argument --tenant: tenant id may only contain letters, digits, '_' and '-'",
        ),
        (
            ["erase", "--tenant", "acme corp", "--session", "s1"],
            "chronicle erase: argument --tenant: tenant id may only contain letters, digits, '_' and '-'",
        ),
        (
            ["erase", "--tenant", "acme", "--session", "a/b"],
            "chronicle erase: argument --session: session id must not contain '/'",
        ),
        (  # a traceback (ValueError: invalid bucket name) once connected
            ["skills", "put", "/dev/null", "--bucket", "Bad_Bucket", "--key", "skills/k"],
            "chronicle skills put: argument --bucket: 'Bad_Bucket' is not an S3 bucket name",
        ),
        (
            ["skills", "sync", "--bucket", "Bad_Bucket"],
            "chronicle skills sync: argument --bucket: 'Bad_Bucket' is not an S3 bucket name",
        ),
        (["bench"], "chronicle bench: the following arguments are required: which"),
        (["chaos", "--bogus"], "chronicle chaos: unrecognized arguments: --bogus"),
        (  # it named --segment-events too: "--segment-events and --to-seq must be at least 1"
            ["archive", "--to-seq", "0"],
            "chronicle archive: argument --to-seq: must be at least 1 (given 0)",
        ),
        (  # taken, and nothing said: it printed no difference, as if there were none to print
            ["verify", "--limit", "-1"],
            "chronicle verify: argument --limit: must be at least 0 (given -1)",
        ),
        (
            ["archive", "--segment-events", "0"],
            "chronicle archive: argument --segment-events: must be at least 1 (given 0)",
        ),
    ],
    ids=[
        "unknown-option",
        "verify-unknown-option",
        "subsubcommand-unknown-option",
        "top-level-unknown-option",
        "subcommand-type",
        "subcommand-required",
        "subcommand-choice",
        "replay-from-seq",
        "replay-to-seq",
        "replay-empty-range",
        "history-as-of-seq",
        "history-as-of-seq-word",
        "replay-session-id",
        "history-tenant-id",
        "skills-put-tenant-id",
        "quarantine-tenant-id",
        "erase-tenant-id",
        "erase-session-id",
        "skills-put-bucket",
        "skills-sync-bucket",
        "bench-no-benchmark",
        "chaos-unknown-option",
        "archive-to-seq",
        "verify-negative-limit",
        "archive-segment-events",
    ],
)
def test_a_refused_command_line_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    done = chronicle(*args)
    assert (done.returncode, done.stdout) == (SETTINGS_EXIT, "")
    assert done.stderr == line + "\n"


def test_help_still_shows_the_usage() -> None:
    done = chronicle("archive", "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: chronicle archive")


@pytest.mark.parametrize("drill", ["bench", "chaos", "failover"])
def test_a_drills_help_shows_its_usage(drill: str) -> None:
    """(``chronicle bench --help`` was "chronicle: unrecognized arguments: --help", exit 2.)"""
    done = chronicle(drill, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: chronicle {drill} ")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["erase", "--tenant", "acme", "--bucket", "Not_A_Bucket"],
            "chronicle erase: --bucket 'Not_A_Bucket' is not an S3 bucket name",
        ),
        (
            ["erase", "--tenant", "acme", "--session", "s1", "--bucket", "skills"],
            "chronicle erase: --bucket goes with a whole tenant (no --session)",
        ),
    ],
    ids=["bucket-name", "bucket-with-session"],
)
def test_a_refused_erase_bucket_is_one_line_and_exit_2_before_anything_is_reached(args: list[str], line: str) -> None:
    done = chronicle(*args)
    assert (done.returncode, done.stdout) == (SETTINGS_EXIT, "")
    assert done.stderr == line + "\n"


def test_keygen_reads_no_setting_a_bad_api_keys_entry_or_ops_key_does_not_stop_it() -> None:
    """``chronicle keygen`` makes the entry a bad ``CHRONICLE_API_KEYS`` lacks: the settings it
    does not use do not stop it (every other command is stopped by them, in one line, exit 2)."""
    env = {"PATH": "/usr/bin:/bin", "CHRONICLE_API_KEYS": '["acme:chr_pasted"]', "CHRONICLE_OPS_KEY": " "}
    done = chronicle("keygen", "--tenant", "acme", env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert "CHRONICLE_API_KEYS entry (add it to the existing list, keeping the entries there): acme:" in done.stdout
