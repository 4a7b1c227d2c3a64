#!/usr/bin/env bash
# Everything the whole test suite needs on a Debian machine, installed only where it is
# missing: Debian packages (sudo first: nothing else here works without it), Node.js and
# npm (unless some Node.js is there already), the test users, the EngineConn runtime.
# `make test-setup` runs it, and so does CI (.ci/run), so a developer's machine gets what
# CI's gets. Idempotent. Run as root, or as a user who may sudo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive

die() { echo "install_test_deps: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "needs root, and sudo is not installed: run it as root"
    sudo -n true 2>/dev/null || die "needs root: run it as root (sudo make test-setup)"
fi
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

command -v apt-get >/dev/null || die "apt-get not found: this script installs Debian packages"

apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then
        as_root apt-get update -qq
        apt_updated=yes
    fi
    echo "installing: $*"
    as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ----- Debian packages: each only when what it provides is missing ----------------------
missing=()
want() { missing+=("$@"); }
command -v sudo >/dev/null || want sudo
command -v pkill >/dev/null || want procps
command -v flock >/dev/null || want util-linux
command -v psql >/dev/null || want postgresql-client
command -v pg_isready >/dev/null || want postgresql-client
command -v make >/dev/null || want make
command -v git >/dev/null || want git
command -v useradd >/dev/null || want passwd
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || want python3-venv
# The benchmarks' native load generator (bench/native; tests/integration/test_bench_native.py).
command -v g++ >/dev/null || want g++
command -v pkg-config >/dev/null || want pkg-config
command -v grpc_cpp_plugin >/dev/null || want protobuf-compiler-grpc
command -v protoc >/dev/null || want protobuf-compiler
pkg-config --exists grpc++ protobuf 2>/dev/null || want libgrpc++-dev libprotobuf-dev
# The failover test's cluster (deploy/ha; tests/integration/test_failover.py): etcd from
# Debian; Patroni from Debian too, with its etcd client.
command -v patroni >/dev/null || want patroni
command -v etcd >/dev/null || want etcd-server
command -v etcdctl >/dev/null || want etcd-client
command -v curl >/dev/null || want curl
/usr/bin/python3 -c 'import etcd' 2>/dev/null || want python3-etcd
# The web console's browser tests (tests/integration/test_console.py): Debian's chromium,
# driven headless by Playwright (which never downloads a browser here).
[ -x /usr/bin/chromium ] || want chromium
command -v chromedriver >/dev/null || want chromium-driver
# Fonts, so that the screenshots the tests write are legible.
[ -d /usr/share/fonts/truetype/dejavu ] || want fonts-dejavu-core
if ((${#missing[@]})); then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    apt_install "${missing[@]}"
else
    echo "all needed Debian packages are present"
fi

# ----- Node.js (tests/integration/test_nodejs_client.py) ---------------------------------
# Any Node.js will do: Debian's is installed only where there is none (Debian's npm
# conflicts with a Node.js from elsewhere, which brings its own npm).
if ! command -v node >/dev/null; then
    apt_install nodejs npm
elif ! command -v npm >/dev/null; then
    if dpkg -s nodejs >/dev/null 2>&1 && [ "$(command -v node)" = /usr/bin/node ]; then
        apt_install npm
    else
        die "node ($(command -v node)) is not Debian's and has no npm: install npm with it"
    fi
fi
echo "node $(node --version), npm $(npm --version 2>/dev/null)"

# ----- test users and the EngineConn runtime ---------------------------------------------
as_root bash scripts/create_test_users.sh
for user in ${LABELRM_TEST_USERS:-lrmtest_a lrmtest_b}; do
    as_root sudo -n -u "$user" true || die "root cannot run 'sudo -n -u $user true'"
done
echo "root can sudo -n to the test users"
as_root bash scripts/install_ec_runtime.sh
