#!/usr/bin/env bash
# Create the unprivileged users the agent's launch tests run EngineConns as, and
# make sure root can switch to them with `sudo -n -u USER` (no password, no tty).
#
# Idempotent: safe to run again. Must run as root. Used by .ci/run
# (setup_engineconn_prereqs); developers run it once on their machine:
#     sudo scripts/create_test_users.sh
# Override the user list with LABELRM_TEST_USERS="u1 u2".
set -euo pipefail

read -r -a USERS <<<"${LABELRM_TEST_USERS:-lrmtest_a lrmtest_b}"
SUDOERS_FILE=/etc/sudoers.d/labelrm-test-users

die() { echo "create_test_users: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v sudo >/dev/null || die "sudo is not installed (apt-get install sudo)"
command -v useradd >/dev/null || die "useradd is missing (package passwd)"

for user in "${USERS[@]}"; do
    if getent passwd "$user" >/dev/null; then
        echo "user $user exists (uid $(id -u "$user"))"
    else
        # No --uid: useradd picks the next free uid from UID_MIN (1000) in login.defs.
        useradd --create-home --shell /bin/bash "$user"
        echo "created user $user (uid $(id -u "$user"))"
    fi
    uid=$(id -u "$user")
    ((uid >= 1000)) || die "user $user has uid $uid < 1000: the agent refuses it"
done

sudo_ok() { sudo -n -u "$1" true >/dev/null 2>&1; }

# The stock Debian sudoers lets root run anything as anyone; a minimal image may
# not. Add only what the tests need: root may run commands as the test users.
need_rule=0
for user in "${USERS[@]}"; do sudo_ok "$user" || need_rule=1; done
if ((need_rule)); then
    echo "root cannot sudo -n to the test users yet: installing $SUDOERS_FILE"
    tmp=$(mktemp)
    {
        echo "# Managed by labelrm scripts/create_test_users.sh: the agent tests launch as these users."
        printf 'root ALL=(%s) NOPASSWD: ALL\n' "$(IFS=,; echo "${USERS[*]}")"
    } >"$tmp"
    visudo -cqf "$tmp" || { rm -f "$tmp"; die "generated sudoers rule does not parse"; }
    install -m 0440 -o root -g root "$tmp" "$SUDOERS_FILE"
    rm -f "$tmp"
fi

for user in "${USERS[@]}"; do
    sudo_ok "$user" || die "root still cannot run 'sudo -n -u $user true'; check /etc/sudoers"
    [ "$(sudo -n -u "$user" id -un)" = "$user" ] || die "sudo -u $user does not run as $user"
    echo "ok: sudo -n -u $user works"
done
