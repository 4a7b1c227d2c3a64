"""`rmctl provider add|list|rm|test`: external resource providers (YARN ResourceManagers).

A basic-auth
password is read from ``$LABELRM_PROVIDER_PASSWORD`` or ``--password-file`` (never a flag:
flags show in ps) and stored by the RM; list calls never return it. With
``--password-secret NAME`` the RM stores only the name and reads the password itself (a
file of its ``provider_secrets_dir``, or ``$LABELRM_PROVIDER_SECRET_<NAME>`` in its
environment): then it never enters the database.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, TextIO

from labelrm.v1 import admin_pb2, external_pb2

from labelrm_client import RMClient
from rmctl.format import fmt_bytes, fmt_time, print_json, print_table, to_json

__all__ = ["register"]

PASSWORD_ENV = "LABELRM_PROVIDER_PASSWORD"


def register(cmds: Any) -> None:
    """Register ``rmctl provider ...`` on rmctl's sub-command parsers."""
    prov = cmds.add_parser(
        "provider", aliases=["providers"], help="external resource providers (YARN queues)"
    )
    sub = prov.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")

    c = sub.add_parser(
        "add",
        help="create or replace a provider",
        description=(
            "Create or replace a provider serving the requests with label cluster=CLUSTER. "
            "Give each ResourceManager web address with --address (an HA pair: two), or "
            "Linkis' ';'-separated form with --rm-web-address. A basic-auth password comes "
            f"from ${PASSWORD_ENV} or --password-file (stored by the RM), or, kept out of "
            "the RM's database, from the secret --password-secret names (a file of the "
            "RM's provider_secrets_dir, or $LABELRM_PROVIDER_SECRET_<NAME> in the RM's "
            "environment); replacing a provider without either keeps what it had."
        ),
    )
    c.add_argument("name", metavar="NAME", help="lower-case name, e.g. prod-yarn")
    c.add_argument("--type", default="yarn", choices=("yarn",))
    c.add_argument("--cluster", required=True, help="value of the cluster label it serves")
    c.add_argument("--address", action="append", default=[], metavar="URL")
    c.add_argument("--rm-web-address", default="", metavar="URL;URL")
    c.add_argument("--auth", choices=("none", "basic"), default="none")
    c.add_argument("--user", default="", help="basic-auth user name")
    c.add_argument("--password-file", default="", metavar="FILE")
    c.add_argument(
        "--password-secret",
        default="",
        metavar="NAME",
        help="the RM reads the password from its secret NAME (not stored)",
    )
    c.add_argument("--request-timeout", type=float, default=5.0, metavar="SECONDS")
    c.add_argument("--cache-ttl", type=float, default=2.0, metavar="SECONDS")
    c.add_argument(
        "--capacity-guaranteed",
        action="store_true",
        help="capacity scheduler: admit against absoluteCapacity, not absoluteMaxCapacity",
    )
    c.set_defaults(func=cmd_provider_add)

    c = sub.add_parser("list", help="list the providers (never their passwords)")
    c.set_defaults(func=cmd_provider_list)

    c = sub.add_parser("rm", aliases=["delete"], help="remove a provider")
    c.add_argument("name", metavar="NAME")
    c.set_defaults(func=cmd_provider_rm)

    c = sub.add_parser("test", help="fetch a provider's figures now and print the queues it sees")
    c.add_argument("name", metavar="NAME")
    c.set_defaults(func=cmd_provider_test)


def _password(args: argparse.Namespace) -> str:
    if args.password_file:
        return Path(args.password_file).read_text().strip()
    return os.environ.get(PASSWORD_ENV, "")


def cmd_provider_add(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl provider add NAME --cluster C --address URL [--address URL] ...`."""
    addresses = list(args.address)
    addresses += [a.strip() for a in args.rm_web_address.split(";") if a.strip()]
    provider = external_pb2.ExternalProvider(
        name=args.name,
        type=args.type,
        cluster=args.cluster,
        addresses=addresses,
        auth=args.auth,
        username=args.user,
        password=_password(args) if args.auth == "basic" and not args.password_secret else "",
        password_secret=args.password_secret,
        timeout_seconds=args.request_timeout,
        cache_ttl_seconds=args.cache_ttl,
        capacity_guaranteed=args.capacity_guaranteed,
    )
    stored = client.put_external_provider(provider)
    if print_json(out, args.output, stored):
        return 0
    _print_providers(out, [stored])
    return 0


def _credentials(p: Any) -> str:
    """`` (user, secret NAME)``: who the provider authenticates as, and with what."""
    parts = [p.username] if p.username else []
    if p.password_secret:
        parts.append(f"secret {p.password_secret}")
    return f" ({', '.join(parts)})" if parts else ""


def cmd_provider_list(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl provider list`."""
    providers = client.list_external_providers()
    if print_json(out, args.output, admin_pb2.ListExternalProvidersResponse(providers=providers)):
        return 0
    _print_providers(out, providers)
    return 0


def _print_providers(out: TextIO, providers: list[Any]) -> None:
    print_table(
        out,
        ("name", "type", "cluster", "addresses", "auth", "ttl", "timeout"),
        (
            (
                p.name,
                p.type,
                f"cluster={p.cluster}",
                ";".join(p.addresses),
                p.auth + _credentials(p),
                f"{p.cache_ttl_seconds:g}s",
                f"{p.timeout_seconds:g}s",
            )
            for p in providers
        ),
    )


def cmd_provider_rm(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl provider rm NAME`."""
    gone = client.delete_external_provider(args.name)
    if args.output == "json":
        print(to_json(gone), file=out)
    else:
        print(f"deleted provider {gone.name} (cluster={gone.cluster})", file=out)
    return 0


def _yarn(r: Any) -> str:
    y = r.yarn
    return f"mem={fmt_bytes(y.queue_memory_bytes)} cpu={y.queue_cpu_millis}m"


def _apps(n: int) -> str:
    return "unlimited" if n >= 2**31 - 1 else str(n)


def cmd_provider_test(client: RMClient, args: argparse.Namespace, out: TextIO) -> int:
    """`rmctl provider test NAME`: the queues the provider's active RM reports now."""
    seen = client.test_external_provider(args.name)
    if print_json(out, args.output, seen):
        return 0
    fetched = fmt_time(seen.queues[0].fetch_time) if seen.queues else "-"
    print(
        f"provider {args.name}: active RM {seen.active_address}, {seen.scheduler} scheduler, "
        f"{len(seen.queues)} queues, fetched {fetched}",
        file=out,
    )
    print_table(
        out,
        ("queue", "leaf", "yarn max", "yarn used", "in flight", "left", "apps", "max apps"),
        (
            (
                q.queue,
                "yes" if q.leaf else "no",
                _yarn(q.yarn_max),
                _yarn(q.yarn_used),
                _yarn(q.in_flight),
                _yarn(q.left),
                f"{q.apps_running} running, {q.apps_pending} pending",
                _apps(q.yarn_max.yarn.queue_instances),
            )
            for q in seen.queues
        ),
    )
    return 0
