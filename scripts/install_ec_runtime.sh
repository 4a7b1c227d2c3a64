#!/usr/bin/env bash
# Install the EngineConn runtime where any user can run it: a virtualenv under
# /opt/labelrm/ec-venv (override with LABELRM_EC_VENV) built from the system
# python3, with labelrm installed into it (not editable: the EngineConn users
# must not need access to this checkout). Re-installs only when the sources changed.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${LABELRM_EC_VENV:-/opt/labelrm/ec-venv}
python=${LABELRM_EC_BASE_PYTHON:-/usr/bin/python3}
stamp="$venv/.labelrm-source-hash"
hash=$(cd "$repo" && cat pyproject.toml $(git ls-files engineconn protos rm_server ecm_agent clients 2>/dev/null || find engineconn protos -type f) 2>/dev/null | sha256sum | cut -d' ' -f1)
if [[ "${1:-}" != "--force" && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
    echo "EngineConn runtime up to date in $venv"
    exit 0
fi
umask 022
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$repo"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$repo"
chmod -R a+rX "$venv"
echo "$hash" > "$stamp"
echo "EngineConn runtime installed in $venv"
