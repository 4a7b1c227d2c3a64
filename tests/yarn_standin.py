"""A stand-in YARN ResourceManager REST server for the tests.

No YARN ResourceManager can run here (no Hadoop package in Debian or PyPI, no container
engine), so this is a small stateful server built from Hadoop's published documentation of the
ResourceManager REST API (ResourceManagerRest.md: ``/ws/v1/cluster/info``, ``/metrics``,
``/scheduler`` for the capacity and the fair scheduler, ``/apps``) and of ResourceManager HA
(a standby RM answers ``/ws/v1/cluster/info`` with ``haState: STANDBY`` and every other web
service request with a temporary redirect to the active RM, body "This is standby RM. ...").

State is shared by the RMs of one HA pair: queues whose used figures follow the applications
started and finished on them, so a test can play "YARN" while labelrm admits against it. Each
RM counts the requests it served per path, can demand HTTP basic auth, answer slowly, fail with
500, answer malformed JSON, or go down altogether.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_APPS = 2147483647


@dataclass
class App:
    app_id: str
    queue: str  # full path
    user: str
    memory_mb: int
    vcores: int
    state: str = "RUNNING"  # RUNNING or ACCEPTED (pending); finished apps are dropped


@dataclass
class Queue:
    """One queue. Capacity scheduler: `capacity` / `max_capacity` in percent of the parent.
    Fair scheduler: `max_mb` / `max_vcores` / `max_apps` absolute."""

    path: str
    capacity: float = 0.0
    max_capacity: float = 100.0
    max_mb: int = 0
    max_vcores: int = 0
    max_apps: int = MAX_APPS
    children: list[Queue] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


class YarnState:
    """The cluster one RM (or an HA pair) reports: totals, queue tree, applications."""

    def __init__(self, scheduler: str, root: Queue, total_mb: int, total_vcores: int) -> None:
        assert scheduler in ("capacity", "fair", "fifo")
        self.scheduler = scheduler
        self.root = root
        self.total_mb = total_mb
        self.total_vcores = total_vcores
        self.apps: dict[str, App] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.cluster_ts = 1700000000000

    # ----- what tests do to "YARN" ------------------------------------------------------

    def start_app(
        self, queue: str, memory_mb: int, vcores: int, user: str = "user1", state: str = "RUNNING"
    ) -> str:
        with self.lock:
            assert self._find(queue) is not None, queue
            app_id = f"application_{self.cluster_ts}_{next(self._ids):04d}"
            self.apps[app_id] = App(app_id, queue, user, memory_mb, vcores, state)
            return app_id

    def finish_app(self, app_id: str) -> None:
        with self.lock:
            del self.apps[app_id]

    def _find(self, path: str) -> Queue | None:
        stack = [self.root]
        while stack:
            q = stack.pop()
            if q.path == path:
                return q
            stack.extend(q.children)
        return None

    def _apps_under(self, q: Queue) -> list[App]:
        prefix = q.path + "."
        return [a for a in self.apps.values() if a.queue == q.path or a.queue.startswith(prefix)]

    # ----- documents, shaped as ResourceManagerRest.md shows them -------------------------

    def info_doc(self, ha_state: str) -> dict[str, Any]:
        return {
            "clusterInfo": {
                "id": self.cluster_ts,
                "startedOn": self.cluster_ts,
                "state": "STARTED",
                "haState": ha_state,
                "resourceManagerVersion": "3.3.6",
                "hadoopVersion": "3.3.6",
            }
        }

    def metrics_doc(self) -> dict[str, Any]:
        with self.lock:
            apps = list(self.apps.values())
        used_mb = sum(a.memory_mb for a in apps if a.state == "RUNNING")
        used_vc = sum(a.vcores for a in apps if a.state == "RUNNING")
        return {
            "clusterMetrics": {
                "appsSubmitted": len(apps),
                "appsCompleted": 0,
                "appsPending": sum(a.state == "ACCEPTED" for a in apps),
                "appsRunning": sum(a.state == "RUNNING" for a in apps),
                "appsFailed": 0,
                "appsKilled": 0,
                "reservedMB": 0,
                "availableMB": self.total_mb - used_mb,
                "allocatedMB": used_mb,
                "totalMB": self.total_mb,
                "reservedVirtualCores": 0,
                "availableVirtualCores": self.total_vcores - used_vc,
                "allocatedVirtualCores": used_vc,
                "totalVirtualCores": self.total_vcores,
                "containersAllocated": 0,
                "containersReserved": 0,
                "containersPending": 0,
                "totalNodes": 1,
                "activeNodes": 1,
                "lostNodes": 0,
                "unhealthyNodes": 0,
                "decommissionedNodes": 0,
                "rebootedNodes": 0,
            }
        }

    def scheduler_doc(self) -> dict[str, Any]:
        with self.lock:
            if self.scheduler == "capacity":
                info = self._capacity_root()
            elif self.scheduler == "fair":
                info = {"type": "fairScheduler", "rootQueue": self._fair(self.root)}
            else:
                info = {
                    "type": "fifoScheduler",
                    "capacity": 1,
                    "usedCapacity": "NaN",
                    "qstate": "RUNNING",
                    "minQueueMemoryCapacity": 1024,
                    "maxQueueMemoryCapacity": 10240,
                    "numNodes": 0,
                    "usedNodeCapacity": 0,
                    "availNodeCapacity": 0,
                    "totalNodeCapacity": 0,
                    "numContainers": 0,
                }
        return {"scheduler": {"schedulerInfo": info}}

    def apps_doc(self, queue: str | None, states: set[str] | None) -> dict[str, Any]:
        with self.lock:
            apps = [
                a
                for a in self.apps.values()
                if (
                    queue is None
                    or a.queue in (queue, "root." + queue)
                    or a.queue.endswith("." + queue)
                )
                and (states is None or a.state in states)
            ]
        if not apps:
            return {"apps": None}
        return {
            "apps": {
                "app": [
                    {
                        "id": a.app_id,
                        "user": a.user,
                        "name": a.app_id,
                        "queue": a.queue.rsplit(".", 1)[-1]
                        if self.scheduler == "capacity"
                        else a.queue,
                        "state": a.state,
                        "finalStatus": "UNDEFINED",
                        "progress": 0,
                        "applicationType": "SPARK",
                        "allocatedMB": a.memory_mb if a.state == "RUNNING" else 0,
                        "allocatedVCores": a.vcores if a.state == "RUNNING" else 0,
                        "runningContainers": 1 if a.state == "RUNNING" else 0,
                    }
                    for a in apps
                ]
            }
        }

    def _used(self, q: Queue) -> tuple[int, int, int, int]:
        apps = self._apps_under(q)
        running = [a for a in apps if a.state == "RUNNING"]
        return (
            sum(a.memory_mb for a in running),
            sum(a.vcores for a in running),
            len(running),
            len(apps) - len(running),
        )

    def _capacity_root(self) -> dict[str, Any]:
        mb, _, _, _ = self._used(self.root)
        return {
            "type": "capacityScheduler",
            "capacity": 100.0,
            "usedCapacity": 100.0 * mb / self.total_mb if self.total_mb else 0.0,
            "maxCapacity": 100.0,
            "queueName": "root",
            "queues": {"queue": [self._capacity(c, 100.0, 100.0) for c in self.root.children]},
        }

    def _capacity(self, q: Queue, parent_abs: float, parent_abs_max: float) -> dict[str, Any]:
        abs_cap = parent_abs * q.capacity / 100
        abs_max = parent_abs_max * q.max_capacity / 100
        mb, vc, running, pending = self._used(q)
        abs_used = 100.0 * mb / self.total_mb if self.total_mb else 0.0
        out: dict[str, Any] = {
            "capacity": q.capacity,
            "usedCapacity": abs_used * 100 / abs_cap if abs_cap else 0.0,
            "maxCapacity": q.max_capacity,
            "absoluteCapacity": abs_cap,
            "absoluteMaxCapacity": abs_max,
            "absoluteUsedCapacity": abs_used,
            "numApplications": running + pending,
            "usedResources": f"<memory:{mb}, vCores:{vc}>",
            "queueName": q.name,
            "state": "RUNNING",
            "resourcesUsed": {"memory": mb, "vCores": vc},
        }
        if q.children:
            out["queues"] = {"queue": [self._capacity(c, abs_cap, abs_max) for c in q.children]}
        else:
            out.update(
                {
                    "type": "capacitySchedulerLeafQueueInfo",
                    "numActiveApplications": running,
                    "numPendingApplications": pending,
                    "numContainers": running,
                    "maxApplications": q.max_apps,
                    "maxApplicationsPerUser": q.max_apps,
                    "maxActiveApplications": 1,
                    "maxActiveApplicationsPerUser": 1,
                    "userLimit": 100,
                    "userLimitFactor": 1.0,
                    "users": None,
                }
            )
        return out

    def _fair(self, q: Queue) -> dict[str, Any]:
        mb, vc, running, pending = self._used(q)
        out: dict[str, Any] = {
            "maxApps": q.max_apps,
            "minResources": {"memory": 0, "vCores": 0},
            "maxResources": {"memory": q.max_mb, "vCores": q.max_vcores},
            "usedResources": {"memory": mb, "vCores": vc},
            "fairResources": {"memory": q.max_mb // 2, "vCores": q.max_vcores // 2},
            "clusterResources": {"memory": self.total_mb, "vCores": self.total_vcores},
            "queueName": q.path,
            "schedulingPolicy": "fair",
        }
        if q.children:
            out["childQueues"] = {"queue": [self._fair(c) for c in q.children]}
        else:
            out.update(
                {
                    "type": "fairSchedulerLeafQueueInfo",
                    "numActiveApps": running,
                    "numPendingApps": pending,
                }
            )
        return out


def capacity_cluster(total_mb: int = 100 * 1024, total_vcores: int = 100) -> YarnState:
    """root.a (40%, max 60%) with root.a.a1 (50% of a, max 100%) and root.a.a2 (50%);
    root.b (60%, max 100%). The documented example's shape: nested parents, unique leaves."""
    root = Queue(
        "root",
        100.0,
        100.0,
        children=[
            Queue(
                "root.a",
                40.0,
                60.0,
                children=[
                    Queue("root.a.a1", 50.0, 100.0, max_apps=50),
                    Queue("root.a.a2", 50.0, 100.0),
                ],
            ),
            Queue("root.b", 60.0, 100.0),
        ],
    )
    return YarnState("capacity", root, total_mb, total_vcores)


def fair_cluster(total_mb: int = 64 * 1024, total_vcores: int = 64) -> YarnState:
    """root.default and root.sample_queue.sample_sub_queue, as in the documented example."""
    root = Queue(
        "root",
        max_mb=total_mb,
        max_vcores=total_vcores,
        children=[
            Queue("root.default", max_mb=8 * 1024, max_vcores=8),
            Queue(
                "root.sample_queue",
                max_mb=32 * 1024,
                max_vcores=32,
                max_apps=50,
                children=[
                    Queue("root.sample_queue.sample_sub_queue", max_mb=16 * 1024, max_vcores=16)
                ],
            ),
        ],
    )
    return YarnState("fair", root, total_mb, total_vcores)


class StandinRM:
    """One ResourceManager web endpoint over `state`, on 127.0.0.1:<ephemeral port>."""

    def __init__(
        self,
        state: YarnState,
        *,
        active: bool = True,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        self.state = state
        self.active = active
        self.basic_auth = basic_auth
        self.peer: StandinRM | None = None  # where a standby redirects
        self.delay = 0.0
        self.fail: str | None = None  # None | "500" | "malformed" (a truncated scheduler doc)
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.down = False

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, path: str) -> int:
        with self._count_lock:
            return self.requests[path]

    def stop(self) -> None:
        """Go down: the port closes (connections are refused)."""
        if not self.down:
            self.down = True
            self._server.shutdown()
            self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        rm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if rm.down:  # a kept-alive connection outlives serve_forever: cut it too
                    self.close_connection = True
                    return
                url = urlsplit(self.path)
                with rm._count_lock:
                    rm.requests[url.path] += 1
                if rm.delay:
                    time.sleep(rm.delay)
                if rm.basic_auth is not None and not self._authorized():
                    self._send(
                        401,
                        b"Unauthorized",
                        "text/plain",
                        {"WWW-Authenticate": 'Basic realm="yarn"'},
                    )
                    return
                if rm.fail == "500":
                    self._send(500, b"<html>Internal Server Error</html>", "text/html")
                    return
                if not rm.active and url.path != "/ws/v1/cluster/info":
                    target = (rm.peer.address if rm.peer else "") + self.path
                    body = f"This is standby RM. The redirect url is: {target}\n".encode()
                    self._send(307, body, "text/plain", {"Location": target})
                    return
                if rm.fail == "malformed" and url.path == "/ws/v1/cluster/scheduler":
                    self._send(
                        200,
                        b'{"scheduler": {"schedulerInfo": {"type": "capacitySch',
                        "application/json",
                    )
                    return
                query = parse_qs(url.query)
                if url.path in ("/ws/v1/cluster", "/ws/v1/cluster/info"):
                    doc = rm.state.info_doc("ACTIVE" if rm.active else "STANDBY")
                elif url.path == "/ws/v1/cluster/metrics":
                    doc = rm.state.metrics_doc()
                elif url.path == "/ws/v1/cluster/scheduler":
                    doc = rm.state.scheduler_doc()
                elif url.path == "/ws/v1/cluster/apps":
                    states = query.get("states", [""])[0]
                    doc = rm.state.apps_doc(
                        query.get("queue", [None])[0],
                        {s.strip().upper() for s in states.split(",")} if states else None,
                    )
                else:
                    self._send(
                        404,
                        b'{"RemoteException": {"exception": "NotFoundException"}}',
                        "application/json",
                    )
                    return
                self._send(200, json.dumps(doc).encode(), "application/json")

            def _authorized(self) -> bool:
                assert rm.basic_auth is not None
                user, password = rm.basic_auth
                expected = base64.b64encode(f"{user}:{password}".encode()).decode()
                return self.headers.get("Authorization", "") == f"Basic {expected}"

            def _send(
                self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        return Handler


class HAPair:
    """Two RMs over one state: `rm1` active, `rm2` standby redirecting to it."""

    def __init__(self, state: YarnState, **kwargs: Any) -> None:
        self.rm1 = StandinRM(state, active=True, **kwargs)
        self.rm2 = StandinRM(state, active=False, **kwargs)
        self.rm1.peer, self.rm2.peer = self.rm2, self.rm1

    @property
    def addresses(self) -> list[str]:
        return [self.rm1.address, self.rm2.address]

    def failover(self) -> None:
        """The standby becomes active and the active one standby (as `yarn rmadmin
        -transitionToActive` after a failure would leave them)."""
        self.rm1.active, self.rm2.active = self.rm2.active, self.rm1.active

    def stop(self) -> None:
        self.rm1.stop()
        self.rm2.stop()
