#!/usr/bin/env bash
# Fails when the checked-in generated protobuf code under protos/ is not what
# `make protos` produces from the .proto files (run by `make protos-check` and CI).
#
# It regenerates INTO the tree, then asks git whether protos/ differs from HEAD.
# On a clean checkout (CI) any difference is drift. Locally, commit or stash your
# own protos/ changes first, or the check reports them too.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "protos-check: not a git work tree (or git refuses it: see 'git status')" >&2
    exit 2
fi

before=$(git status --porcelain --untracked-files=all -- protos/)
"$PY" scripts/gen_protos.py
after=$(git status --porcelain --untracked-files=all -- protos/)

if [ -z "$after" ]; then
    echo "protos-check: generated code matches the .proto files"
    exit 0
fi

echo "protos-check: FAILED: protos/ differs from git HEAD after regeneration" >&2
if [ -n "$before" ]; then
    echo "(note: protos/ already had uncommitted changes before regeneration:)" >&2
    printf '%s\n' "$before" >&2
fi
echo "--- git status --porcelain protos/" >&2
printf '%s\n' "$after" >&2
echo "--- git diff protos/" >&2
git --no-pager diff --stat -- protos/ >&2
git --no-pager diff -- protos/ >&2
untracked=$(git ls-files --others --exclude-standard -- protos/)
if [ -n "$untracked" ]; then
    echo "--- untracked files under protos/ (new generated files not committed?)" >&2
    printf '%s\n' "$untracked" >&2
fi
echo "Fix: run 'make protos' and commit the result." >&2
exit 1
