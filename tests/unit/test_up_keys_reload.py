"""What SIGHUP to `chronicle up` does to a local cluster's configurations: each node's written
again with the keys file's users, and the rest of it (name, routes, store) as at its start; a file
that does not parse leaves every one as it was. (The single server, its processes and the signals
are tested end to end: tests/e2e/test_chronicle_up.py.)"""

from __future__ import annotations

import functools
import json
import signal
from pathlib import Path

import pytest

from events.credentials import nkey_public_key, tenant_nkey_seed
from services.ops.localstack import KeysReload, local_cluster, write_cluster_node_config
from services.ops.natsconf import NatsAccess
from services.settings import Settings, api_key_entry, grants_fingerprint, new_operator_seed


def test_a_reload_writes_each_node_s_configuration_again_with_the_file_s_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "api-keys"
    keys_file.write_text("# nobody yet\n")
    settings = Settings(nats_nkey_seed=new_operator_seed(), api_keys=[], api_keys_file=str(keys_file))
    nodes = local_cluster(14222, 3)
    keys = KeysReload(settings, NatsAccess.of(settings))
    for i in range(3):
        write_cluster_node_config(nodes, i, tmp_path, keys.access, "route-secret")  # as at the start
        keys.configs.append(functools.partial(write_cluster_node_config, nodes, i, tmp_path, password="route-secret"))
    confs = [tmp_path / f"nats-n{i + 1}.conf" for i in range(3)]
    before = [json.loads(conf.read_text()) for conf in confs]
    assert not keys.reload([])  # no SIGHUP came: nothing to do

    keys_file.write_text(f"{api_key_entry('acme', 'chr_new')}\n")
    keys.ask(signal.SIGHUP, None)
    assert keys.reload([])
    fingerprint = grants_fingerprint(settings.with_keys_file_read().grants_by_key_hash())
    assert capsys.readouterr().out == (
        f"chronicle up: api keys reloaded: 1 entries from {keys_file}, keys fingerprint {fingerprint} (0 nats-server "
        "configuration(s) written again "
        "and reloaded, 0 API process(es) sent SIGHUP)\n"
    )
    after = [json.loads(conf.read_text()) for conf in confs]
    for old, new in zip(before, after, strict=True):
        users = new.pop("authorization")["users"]
        assert [u["nkey"] for u in users][1:] == [nkey_public_key(tenant_nkey_seed("chr_new"))]
        old.pop("authorization")
        assert new == old  # the same listener, store, name and routes: nats-server takes the reload

    written = [conf.read_text() for conf in confs]
    keys_file.write_text("acme:chr_pasted\n")  # a raw key, not an entry
    keys.ask(signal.SIGHUP, None)
    assert not keys.reload([])
    assert capsys.readouterr().err == (
        "chronicle up: api keys not reloaded, nothing changed (the previous keys stay in force): "
        f"{keys_file} line 1: an entry of tenant 'acme' is not 'tenant:sha256hex[:nkey|:read-only]': the digest is "
        "not 64 hex digits\n"
    )
    assert [conf.read_text() for conf in confs] == written  # acme's user kept, nothing written
    assert keys.settings.file_entry_count() == 1
