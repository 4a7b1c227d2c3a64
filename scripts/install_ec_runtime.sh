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
# One install at a time per runtime (parallel test workers all ask for it at start):
# the others wait here, then find it up to date.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
# What pip would install: the files in the tree, tracked or new (--others), by name and
# content; a tracked file deleted in the tree is skipped (it is not installed either).
sources() {
    git ls-files -z --cached --others --exclude-standard labelrm_common engineconn protos rm_server ecm_agent labelrm_client clients rmctl 2>/dev/null ||
        find labelrm_common engineconn protos rm_server ecm_agent labelrm_client clients rmctl -type f -print0
}
hash=$(cd "$repo" && { cat pyproject.toml; sources | sort -zu | while IFS= read -r -d '' f; do
    if [[ -f "$f" ]]; then printf '%s\0' "$f"; cat "$f"; fi
done; } | sha256sum | cut -d' ' -f1)
if [[ "${1:-}" != "--force" && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
    echo "EngineConn runtime up to date in $venv"
    exit 0
fi
umask 022
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
fi
# Built from a copy of exactly those files: a build from the checkout itself would go
# through its build/ directory, where setuptools keeps modules the tree has since moved
# or deleted, and would install them again.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
(cd "$repo" && { printf '%s\0' pyproject.toml README.md; sources; } | sort -zu |
    tar --null --no-recursion -T - -cf - | tar -xf - -C "$src")
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$src"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$src"
# Bytecode for everything, written now as root: the users cannot write __pycache__ here,
# so a module without it would be compiled again by every EngineConn start.
"$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null || true
chmod -R a+rX "$venv"
echo "$hash" > "$stamp"
echo "EngineConn runtime installed in $venv"
