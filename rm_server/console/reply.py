"""The console's JSON answers: one place that turns a document into a response, its
strings as the page may show them (`views.shown`: control characters written out)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from rm_server.console.views import shown


def body(doc: Any) -> bytes:
    """`doc` as the bytes of a JSON answer (computed once for a view that many browsers
    read: the cache keeps these bytes)."""
    return json.dumps(shown(doc), separators=(",", ":")).encode()


def reply(doc: Any, status: int = 200) -> web.Response:
    """A JSON answer of `doc`."""
    return raw(body(doc), status)


def raw(data: bytes, status: int = 200) -> web.Response:
    """A JSON answer of bytes from `body`."""
    return web.Response(body=data, status=status, content_type="application/json")
