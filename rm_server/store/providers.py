"""External resource providers (migration 0009) and the label records of external queues."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from rm_server.domain.external import AuthKind, ProviderConfig
from rm_server.domain.resources import Resource
from rm_server.errors import FailedPrecondition, NotFound
from rm_server.store.codec import jres, res
from rm_server.store.db import Conn

_COLUMNS = "name, type, cluster, config"


def _provider(row: tuple[Any, ...]) -> ProviderConfig:
    name, type_, cluster, config = row
    return ProviderConfig.from_stored(name, type_, cluster, config)


async def put_provider(conn: Conn, provider: ProviderConfig, now: datetime) -> ProviderConfig:
    """Create or replace a provider (by name); another provider's cluster is refused.

    Replacing a basic-auth provider with neither a password nor a secret's name keeps the
    stored one (an operator changing a timeout need not handle the secret again); auth
    "none" drops it, and a password replaces a secret's name and the reverse."""
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM external_provider WHERE name = %s FOR UPDATE",  # noqa: S608
        (provider.name,),
    )
    row = await cur.fetchone()
    if (
        row is not None
        and provider.auth is AuthKind.BASIC
        and not (provider.password or provider.password_secret)
    ):
        stored = _provider(row)
        provider = replace(
            provider, password=stored.password, password_secret=stored.password_secret
        )
    try:
        async with conn.transaction():  # a savepoint: the clash leaves the transaction usable
            await conn.execute(
                "INSERT INTO external_provider"
                " (name, type, cluster, config, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET type = EXCLUDED.type,"
                " cluster = EXCLUDED.cluster, config = EXCLUDED.config,"
                " updated_at = EXCLUDED.updated_at",
                (
                    provider.name,
                    provider.type.value,
                    provider.cluster,
                    Jsonb(provider.to_config_json()),
                    now,
                    now,
                ),
            )
    except pg_errors.UniqueViolation:
        raise FailedPrecondition(
            f"another provider already serves cluster={provider.cluster}",
            state="CLUSTER_TAKEN",
            reason="PROVIDER_CLUSTER_TAKEN",
        ) from None
    return provider


async def delete_provider(conn: Conn, name: str) -> ProviderConfig:
    cur = await conn.execute(
        f"DELETE FROM external_provider WHERE name = %s RETURNING {_COLUMNS}",  # noqa: S608
        (name,),
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"provider {name} not found")
    return _provider(row)


async def list_providers(conn: Conn) -> list[ProviderConfig]:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM external_provider ORDER BY name"  # noqa: S608
    )
    return [_provider(r) for r in await cur.fetchall()]


async def ensure_queue_row(conn: Conn, label: str, now: datetime) -> None:
    """Create the label record of an external queue (no maximum: the live figures are the
    limit, checked at admission), if it is not there yet."""
    zero = Resource.yarn("", 0, 0, 0)
    await conn.execute(
        "INSERT INTO label_resource (label, source, kind, max_resource, protected, used,"
        " locked, created_at, updated_at) VALUES (%s, 'external', %s, NULL, %s, %s, %s, %s, %s)"
        " ON CONFLICT (label) DO NOTHING",
        (label, zero.kind.value, jres(zero), jres(zero), jres(zero), now, now),
    )


async def queue_rows_locked(conn: Conn, prefix: str) -> dict[str, Resource]:
    """The locked resource of every external queue record whose label starts with `prefix`."""
    cur = await conn.execute(
        "SELECT label, locked FROM label_resource WHERE source = 'external'"
        " AND starts_with(label, %s)",
        (prefix,),
    )
    return {label: res(locked) for label, locked in await cur.fetchall()}
