"""External providers on a secured RM: what users learn of the system behind a cluster
label when it fails (the cluster, not its addresses), and where the provider's
password is kept. Real gRPC with TLS and tokens to an in-process RM; real HTTP from
the RM to the stand-in YARN RM (tests/yarn_standin.py)."""

from __future__ import annotations

import asyncio
import logging
import re

import grpc
import pytest
from labelrm.v1 import admin_pb2, resource_manager_pb2

from rmctl import main
from tests.integration.security_fixtures import make_pki, start_secure, stop_secure
from tests.integration.test_external_yarn import A1, capacity, dy, provider
from tests.support.messages import apply_req, lbl
from tests.support.refusals import bad_field, refused

__all__ = ["capacity"]  # test_external_yarn's fixture, used here too

ALICE = "userCreator=alice-IDE,engineType=spark-3.2.1,cluster=prod"
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
async def srm(database_url, tmp_path):
    rm = await start_secure(database_url, make_pki(tmp_path / "pki"))
    try:
        yield rm
    finally:
        await stop_secure(rm)


def leaks(text: str, addresses: list[str]) -> list[str]:
    """What of the system behind the cluster `text` gives away."""
    found = [a for a in addresses if a in text]
    found += [w for w in ("127.0.0.1", "http", "ConnectError", "prod-yarn") if w in text]
    found += re.findall(r":\d{4,5}\b", text)
    return found


async def test_a_users_refusal_names_the_cluster_not_its_addresses(srm, capacity, caplog):
    """YARN goes down: Alice's Apply says which cluster is unavailable, never the
    ResourceManagers' addresses or errors (users may not list providers); the admin's
    `provider test` and the RM's log have them."""
    _state, pair = capacity
    admin = srm.stubs(srm.channel("root"))
    alice = srm.stubs(srm.channel("alice"))
    await admin.admin.PutExternalProvider(provider(pair.addresses, ttl=0))
    assert (await alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1)))).ticket.ticket_id
    pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "right")  # it now wants credentials
    err = await refused(
        alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1))), PRECONDITION, "EXTERNAL_AUTH"
    )
    assert "cluster=prod" in err.details() and leaks(err.details(), pair.addresses) == []
    pair.rm1.basic_auth = pair.rm2.basic_auth = None
    pair.rm1.fail = "malformed"
    err = await refused(
        alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1))), UNAVAILABLE, "EXTERNAL_MALFORMED"
    )
    assert "cluster=prod" in err.details() and leaks(err.details(), pair.addresses) == []
    pair.rm1.fail = None

    pair.stop()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="rm_server.external")
    err = await refused(
        alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1))), UNAVAILABLE, "EXTERNAL_UNAVAILABLE"
    )
    assert "YARN of cluster=prod is unavailable" in err.details()
    assert leaks(err.details(), pair.addresses) == [], err.details()
    # The queue's record, which every user may read, says so the same way.
    get = resource_manager_pb2.GetLabelResourceRequest(labels=lbl(A1))
    record = (await alice.rm.GetLabelResource(get)).label_resource
    assert "cluster=prod" in record.external_queue.error
    assert leaks(record.external_queue.error, pair.addresses) == []
    # The operator's: the log (one line per failed fetch) and `provider test`.
    logged = [r.getMessage() for r in caplog.records if "fetch failed" in r.getMessage()]
    assert logged and all(pair.rm1.address in line for line in logged)
    test = admin_pb2.TestExternalProviderRequest(name="prod-yarn")
    err = await refused(admin.admin.TestExternalProvider(test), UNAVAILABLE)
    assert pair.rm1.address in err.details()


async def test_a_providers_password_can_stay_out_of_the_database(
    database_url, tmp_path, capacity, monkeypatch, capsys
):
    """The operator names a secret instead of storing the password: the RM reads it from
    a file of provider_secrets_dir (or its environment) at every fetch, and the database,
    and so its backups, holds the name only."""
    _state, pair = capacity
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    secret = secrets / "prod-yarn"
    secret.write_text("right\n")
    secret.chmod(0o600)
    rm = await start_secure(
        database_url, make_pki(tmp_path / "pki"), provider_secrets_dir=str(secrets)
    )
    try:
        admin = rm.stubs(rm.channel("root"))
        alice = rm.stubs(rm.channel("alice"))
        pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "right")
        rmctl = ["--rm", rm.user_target, "--tls-ca", rm.pki.ca, "--token", rm.pki.tokens["root"]]
        add = ["provider", "add", "prod-yarn", "--cluster", "prod", "--auth", "basic",
               "--user", "yarn", "--password-secret", "prod-yarn", "--cache-ttl", "0",
               *(f"--address={a}" for a in pair.addresses)]  # fmt: skip
        assert await asyncio.to_thread(main, [*rmctl, *add]) == 0
        assert "basic (yarn, secret prod-yarn)" in capsys.readouterr().out
        req = provider(pair.addresses, ttl=0)
        req.provider.auth, req.provider.username = "basic", "yarn"
        req.provider.password_secret = "prod-yarn"
        stored = (
            await admin.admin.ListExternalProviders(admin_pb2.ListExternalProvidersRequest())
        ).providers[0]
        assert stored.password_secret == "prod-yarn" and not stored.has_password
        assert (await alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1)))).ticket.ticket_id
        rows = await rm.server.core.db.run(_provider_rows, read_only=True)
        assert "right" not in rows and '"password_secret": "prod-yarn"' in rows, rows
        # Rotation: YARN wants a new password, the file gets it, the next fetch uses it.
        pair.rm1.basic_auth = pair.rm2.basic_auth = ("yarn", "rotated")
        await refused(
            alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1))), PRECONDITION, "EXTERNAL_AUTH"
        )
        secret.write_text("rotated")
        assert (await alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1)))).ticket.ticket_id
        # Or in the RM's environment.
        secret.unlink()
        monkeypatch.setenv("LABELRM_PROVIDER_SECRET_PROD_YARN", "rotated")
        assert (await alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1)))).ticket.ticket_id
        # Gone from both: users learn the cluster only, the log says where the RM looked.
        monkeypatch.delenv("LABELRM_PROVIDER_SECRET_PROD_YARN")
        err = await refused(
            alice.rm.Apply(apply_req(ALICE, dy("root.a.a1", 1))), PRECONDITION, "EXTERNAL_AUTH"
        )
        assert "cluster=prod" in err.details()
        for hidden in ("prod-yarn", "LABELRM_PROVIDER_SECRET", str(secrets)):
            assert hidden not in err.details()
        # A secret that is nowhere is refused when named; a name cannot be a path, nor
        # another environment variable.
        req.provider.password_secret = "nowhere"
        err = await refused(
            admin.admin.PutExternalProvider(req), PRECONDITION, "EXTERNAL_SECRET_MISSING"
        )
        assert "nowhere" in err.details()
        for bad in ("../tokens.toml", "DATABASE_URL", "a/b", ""):
            req.provider.password_secret = bad
            req.provider.password = "" if bad else "s3cret"
            if not bad:  # both a password and a secret's name
                req.provider.password_secret = "prod-yarn"
            err = await refused(admin.admin.PutExternalProvider(req), INVALID)
            assert bad_field(err) == "provider.password_secret", bad
    finally:
        await stop_secure(rm)


async def _provider_rows(conn) -> str:
    cur = await conn.execute("SELECT name, config::text FROM external_provider")
    return repr(await cur.fetchall())
