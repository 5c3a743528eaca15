"""Each migration has a version of its own: two files of one version (two branches that each took
the next number) would run both on a new database, the second failing on the version's key, and
a database that applied one would skip the other for good."""

from collections import Counter

from projections.migrate import migration_files


def test_every_migration_version_is_one_files() -> None:
    versions = Counter(version for version, _, _ in migration_files())
    assert [v for v, n in versions.items() if n > 1] == []
    assert sorted(versions) == list(range(1, max(versions) + 1))  # no number skipped either
