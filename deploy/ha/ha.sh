#!/usr/bin/env bash
# A local high-availability PostgreSQL for labelrm: one etcd member and three Patroni
# members with synchronous replication, all on loopback (the layout a production cluster
# spreads over three hosts; docs/operations.md, "High availability").
#
#   deploy/ha/ha.sh up       start etcd and the three members, wait for a primary, two
#                            streaming replicas and (synchronous mode) the named standby
#   deploy/ha/ha.sh down     stop everything and delete the state directory
#   deploy/ha/ha.sh status   patronictl list
#   deploy/ha/ha.sh url      the multi-host URL rm-server replicas use
#
# Environment: HA_DIR (state, default /tmp/labelrm-ha), HA_PG_BASE_PORT (members listen on
# BASE+1..BASE+3, default 5440), HA_REST_BASE_PORT (Patroni REST, default 8010),
# HA_ETCD_PORT (default 23790), HA_SYNC (1 = synchronous_mode, the default; 0 = async),
# HA_SYNC_STRICT (1 = synchronous_mode_strict; default 0, see docs/operations.md),
# HA_WATCHDOG (Patroni's watchdog mode: off, the default here, automatic or required),
# HA_TTL / HA_LOOP_WAIT / HA_RETRY_TIMEOUT (Patroni timing, defaults 20 / 2 / 4),
# HA_PATRONI_VENV (the pinned Patroni's virtualenv, default /opt/labelrm/patroni-venv).
# PostgreSQL refuses to run as root: as root the members run as the `postgres` user.
#
# Patroni is the version deploy/ha/install_patroni.sh pins, in a virtualenv of its own
# (`up` installs it when missing): Debian 12's Patroni 3.0.2 lets a primary that was
# frozen past its leader key's TTL take the key back when it resumes (docs/operations.md).
set -euo pipefail

HA_DIR=${HA_DIR:-/tmp/labelrm-ha}
PG_BASE=${HA_PG_BASE_PORT:-5440}
REST_BASE=${HA_REST_BASE_PORT:-8010}
ETCD_PORT=${HA_ETCD_PORT:-23790}
ETCD_PEER_PORT=$((ETCD_PORT + 10))
SYNC=${HA_SYNC:-1}
SYNC_STRICT=${HA_SYNC_STRICT:-0}
WATCHDOG=${HA_WATCHDOG:-off}
TTL=${HA_TTL:-20}
LOOP_WAIT=${HA_LOOP_WAIT:-2}
RETRY_TIMEOUT=${HA_RETRY_TIMEOUT:-4}
SCOPE=labelrm
MEMBERS=(pg1 pg2 pg3)
PG_BIN=${HA_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATRONI_VENV=${HA_PATRONI_VENV:-/opt/labelrm/patroni-venv}
PATRONI=$PATRONI_VENV/bin/patroni
PATRONICTL=$PATRONI_VENV/bin/patronictl
PATRONI_VERSION=$(sed -n 's/^PATRONI_VERSION=//p' "$HERE/install_patroni.sh")

if [ "$(id -u)" -eq 0 ]; then RUN_AS=(runuser -u postgres --); OWNER=postgres; else RUN_AS=(); OWNER=$(id -un); fi

member_port() { echo $((PG_BASE + $1)); }
rest_port() { echo $((REST_BASE + $1)); }

url() {
    local hosts=() i
    for i in 1 2 3; do hosts+=("127.0.0.1:$(member_port "$i")"); done
    local IFS=,
    echo "postgresql://postgres@${hosts[*]}/postgres?target_session_attrs=read-write&connect_timeout=2"
}

write_member_config() {  # name index
    local name=$1 i=$2
    cat > "$HA_DIR/$name.yml" <<YAML
scope: $SCOPE
name: $name
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$(rest_port "$i")
  connect_address: 127.0.0.1:$(rest_port "$i")
etcd3:
  hosts: 127.0.0.1:$ETCD_PORT
# Patroni arms /dev/watchdog while this member is primary and kicks it every HA loop:
# a primary whose loop stalls for ttl - safety_margin seconds has its host reset before
# another member may take its leader key. Off unless HA_WATCHDOG says otherwise: the
# three members here share one host, which a reset would take down whole (and a freeze
# test stalls the primary's loop on purpose). One member per host in production, with
# `required` (docs/operations.md, "Fencing a frozen primary").
watchdog:
  mode: $WATCHDOG
  device: /dev/watchdog
  safety_margin: 5
bootstrap:
  dcs:
    ttl: $TTL
    loop_wait: $LOOP_WAIT
    retry_timeout: $RETRY_TIMEOUT
    maximum_lag_on_failover: 1048576
    synchronous_mode: $([ "$SYNC" = 1 ] && echo true || echo false)
    synchronous_mode_strict: $([ "$SYNC_STRICT" = 1 ] && echo true || echo false)
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 200
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        fsync: "on"
        # rm-server recognises the "canceling wait for synchronous replication" warning
        # (a commit not confirmed by the standby) by its text: keep it in English.
        lc_messages: C
  initdb:
    - encoding: UTF8
    - data-checksums
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication replicator 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(member_port "$i")
  connect_address: 127.0.0.1:$(member_port "$i")
  data_dir: $HA_DIR/$name/data
  bin_dir: $PG_BIN
  pgpass: $HA_DIR/$name/pgpass
  authentication:
    superuser:
      username: postgres
      password: labelrm-ha
    replication:
      username: replicator
      password: labelrm-ha
  parameters:
    unix_socket_directories: $HA_DIR/$name
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
YAML
}

wait_for() {  # description seconds command...
    local what=$1 secs=$2
    shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "ha.sh: timed out after ${secs}s waiting for $what" >&2
            return 1
        fi
        sleep 0.5
    done
}

primary_ready() {
    local i
    for i in 1 2 3; do
        if curl -fsS "http://127.0.0.1:$(rest_port "$i")/primary" >/dev/null 2>&1; then return 0; fi
    done
    return 1
}

replicas_streaming() {
    local n=0 i
    for i in 1 2 3; do
        curl -fsS "http://127.0.0.1:$(rest_port "$i")/replica" >/dev/null 2>&1 && n=$((n + 1))
    done
    ((n == 2))
}

sync_standby_named() {  # Patroni has named a synchronous standby in etcd (its /sync key)
    local i
    for i in 1 2 3; do
        curl -fsS "http://127.0.0.1:$(rest_port "$i")/sync" >/dev/null 2>&1 && return 0
    done
    return 1
}

up() {
    for tool in etcd curl; do
        command -v "$tool" >/dev/null || { echo "ha.sh: $tool not found (apt-get install etcd-server curl)" >&2; exit 2; }
    done
    HA_PATRONI_VENV=$PATRONI_VENV bash "$HERE/install_patroni.sh" >/dev/null
    local version
    version=$("$PATRONI" --version | cut -d' ' -f2)
    if [ "$version" != "$PATRONI_VERSION" ]; then
        echo "ha.sh: $PATRONI is Patroni $version, not the pinned $PATRONI_VERSION" >&2
        exit 2
    fi
    if [ -d "$HA_DIR" ]; then down >/dev/null 2>&1 || true; fi
    mkdir -p "$HA_DIR"
    chmod 0755 "$HA_DIR"
    etcd --name etcd1 --data-dir "$HA_DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "etcd1=http://127.0.0.1:$ETCD_PEER_PORT" --enable-v2=true \
        >"$HA_DIR/etcd.log" 2>&1 &
    echo $! >"$HA_DIR/etcd.pid"
    wait_for "etcd" 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
    local i name
    for i in 1 2 3; do
        name=${MEMBERS[$((i - 1))]}
        mkdir -p "$HA_DIR/$name"
        write_member_config "$name" "$i"
        [ -n "${RUN_AS[*]}" ] && chown -R "$OWNER" "$HA_DIR/$name" "$HA_DIR/$name.yml"
        chmod 0700 "$HA_DIR/$name"
        # setsid: a member is its own process group, so a test can kill -9 one member whole.
        setsid "${RUN_AS[@]}" "$PATRONI" "$HA_DIR/$name.yml" >"$HA_DIR/$name.log" 2>&1 &
        echo $! >"$HA_DIR/$name.pid"
        if ((i == 1)); then wait_for "the first primary" 90 primary_ready; fi
    done
    wait_for "two streaming replicas" 120 replicas_streaming
    # Until Patroni names the synchronous standby (a loop or two after the replicas
    # stream), commits are acknowledged without a standby's flush and any replica may be
    # promoted: a crash then can lose acknowledged writes. Up means up as configured.
    if [ "$SYNC" = 1 ]; then wait_for "a synchronous standby" 120 sync_standby_named; fi
    echo "HA cluster up: $(url)"
}

ours() {  # pid: whether the process is still one this cluster started (its command
    # line names a path in HA_DIR): a pid file outlives its process, and the number may
    # since belong to someone else's
    local pid=$1 cmdline
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmdline" == *"$HA_DIR/"* ]]
}

signal_ours() {  # signal pid: the process (and its group, which it leads) if it is ours
    local sig=$1 pid=$2
    ours "$pid" || return 0
    kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
}

down() {
    local f pid pids=()
    for f in "$HA_DIR"/pg*.pid "$HA_DIR"/etcd.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        ours "$pid" && pids+=("$pid")
    done
    for pid in "${pids[@]}"; do
        signal_ours TERM "$pid"
    done
    local deadline=$((SECONDS + 30))
    for pid in "${pids[@]}"; do
        while ours "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        signal_ours KILL "$pid"
    done
    # postmasters that outlived their Patroni (a kill -9 of Patroni leaves them running)
    for f in "$HA_DIR"/pg*/data/postmaster.pid; do
        [ -f "$f" ] || continue
        pid=$(head -n 1 "$f")
        ours "$pid" && kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$HA_DIR"
    echo "HA cluster down"
}

status() {
    "$PATRONICTL" -c "$HA_DIR/pg1.yml" list
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    url) url ;;
    *) echo "usage: $0 up|down|status|url" >&2; exit 2 ;;
esac
