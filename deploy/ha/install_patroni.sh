#!/usr/bin/env bash
# Install the pinned Patroni that deploy/ha/ha.sh runs, in a virtualenv of its own
# (default /opt/labelrm/patroni-venv; override with HA_PATRONI_VENV), built from the
# system python3 so that the `postgres` user (the members run as it when ha.sh runs as
# root) can execute it. Idempotent: re-installs only when the pin changed.
#
# Why not Debian's package: Patroni 3.0.2 (Debian 12) has an etcd3 bug that makes a
# primary that was frozen past its leader key's TTL take the key back over the new
# primary when it resumes, which then is demoted and rewound, losing every write it
# acknowledged (fixed upstream in Patroni 3.0.3, "make sure the leader key isn't
# unconditionally overwritten"). docs/operations.md, "High availability".
set -euo pipefail

PATRONI_VERSION=4.1.5
venv=${HA_PATRONI_VENV:-/opt/labelrm/patroni-venv}
python=${HA_PATRONI_BASE_PYTHON:-/usr/bin/python3}
requirement="patroni[etcd3,psycopg3]==$PATRONI_VERSION"
stamp="$venv/.labelrm-requirement"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$requirement" && -x "$venv/bin/patroni" ]]; then
    echo "Patroni $PATRONI_VERSION up to date in $venv"
    exit 0
fi
umask 022
mkdir -p "$(dirname "$venv")"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check "$requirement"
chmod -R a+rX "$venv"
echo "$requirement" > "$stamp"
echo "Patroni $("$venv/bin/patroni" --version | cut -d' ' -f2) installed in $venv"
