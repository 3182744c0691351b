"""Any gateway answers for any group and transactional id: requests for one another gateway
coordinates are forwarded to it, transparently (curl against any gateway works; no client needs to
know who coordinates).

An ASGI middleware inside the app's authentication gate and body limit: a request is
authenticated here first, then again by the owner, which also authorizes it with its own ACLs, so
a key refused on the owner is refused through every gateway. One hop only: a forwarded request
(`X-Topiclake-Forwarded-By`) that reaches a gateway which does not own it either (views of
the membership differ for a moment) is answered 503 NOT_COORDINATOR, and the client retries.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.cluster import Cluster
from broker.transactions import RemoteAdd
from conf import AuthSettings
from delta_log.core.acl import Principal, key_of
from delta_log.core.ownership import group_resource, transaction_resource
from delta_log.errors import CoordinatorNotAvailableError, NotCoordinatorError, TopiclakeError, error_of

log = logging.getLogger(__name__)

FORWARDED_BY = "x-topiclake-forwarded-by"
#: on a forwarded request: the address the client connected to the first gateway from (what a
#: group's description shows as the member's client host); read only beside FORWARDED_BY
FORWARDED_FOR = "x-topiclake-forwarded-for"
#: the routes of one coordinated resource, and the resource: a group's (/groups/{g} and below,
#: not the listing) and a transactional id's (/transactions/{id} and below)
COORDINATED = (
    (re.compile(r"^/groups/([^/]+)(?:/|$)"), group_resource),
    (re.compile(r"^/transactions/([^/]+)(?:/|$)"), transaction_resource),
)


def _coordinated(path: str) -> tuple[str, str] | None:
    """(the resource, its name) whose coordinator serves `path`, if one does."""
    for pattern, resource in COORDINATED:
        if (found := pattern.match(path)) is not None:
            return resource(found.group(1)), found.group(1)
    return None


#: hop-by-hop headers (RFC 9110 7.6.1), those the client library recomputes, and where a browser's
#: request came from: this gateway checked that already (ingest_gateway.browser_guard), and the
#: owner, reached on another address, would take the console's own writes for another site's
_DROP = {
    b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te", b"trailer", b"host", b"content-length",
    b"origin", b"referer", b"sec-fetch-site", b"sec-fetch-mode", b"sec-fetch-dest", b"sec-fetch-user",
}  # fmt: skip


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body (bounded: the body limit middleware outside counts it); None if the
    client went away."""
    body = bytearray()
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes) -> Receive:
    """A `receive` that hands the app a body already read, then waits like a live connection."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never set: the server cancels on disconnect
        return {"type": "http.disconnect"}

    return receive


class GroupForwardingMiddleware:
    def __init__(self, app: ASGIApp, app_state: Any, respond: Callable[[TopiclakeError], ASGIApp]) -> None:
        self.app = app
        self.state = app_state  # `cluster` and `forwarder` appear there at start (None: one gateway)
        self.respond = respond  # (exc) -> ASGI app answering the error envelope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cluster: Cluster | None = getattr(self.state, "cluster", None)
        found = _coordinated(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None or cluster is None:
            await self.app(scope, receive, send)
            return
        resource, name = found
        owner = cluster.owner(resource)
        if owner is not None and owner.gateway_id == cluster.me.gateway_id and cluster.self_live:
            await self.app(scope, receive, send)
            return
        forwarded = any(k == FORWARDED_BY.encode() for k, _ in scope["headers"])
        if owner is None or forwarded:
            await self._refuse(
                NotCoordinatorError(
                    f"This gateway does not coordinate {resource.split(':', 1)[0]} {name!r} "
                    f"({'no gateway is live' if owner is None else f'gateway {owner.gateway_id} does'}).",
                    **({"group": name} if resource == group_resource(name) else {"transactional_id": name}),
                ),
                scope,
                receive,
                send,
            )
            return
        body = await _read_body(receive)
        if body is None:
            return
        if await self._forward(cluster, owner.url, owner.gateway_id, body, scope, send):
            return
        await cluster.refresh()  # the owner cannot be reached: did it leave?
        again = cluster.owner(resource)
        if again is not None and again.gateway_id == cluster.me.gateway_id and cluster.self_live:
            await self.app(scope, _replay(body), send)
            return
        if again is not None and again.gateway_id != owner.gateway_id:
            if await self._forward(cluster, again.url, again.gateway_id, body, scope, send):
                return
            owner = again
        await self._refuse(
            CoordinatorNotAvailableError(
                f"The coordinator of {name!r}, gateway {owner.gateway_id}, cannot be reached; another gateway takes "
                "over what it coordinated once its membership times out.",
                gateway=owner.gateway_id,
            ),
            scope,
            _replay(b""),
            send,
        )

    async def _refuse(self, exc: TopiclakeError, scope: Scope, receive: Receive, send: Send) -> None:
        await self.respond(exc)(scope, receive, send)

    async def _forward(self, cluster: Cluster, url: str, owner_id: str, body: bytes, scope: Scope, send: Send) -> bool:
        """Relay the request to `url` and its answer back; False if it could not be sent."""
        client: httpx.AsyncClient = self.state.forwarder
        headers = [
            (k, v) for k, v in scope["headers"] if k.lower() not in _DROP and k.lower() != FORWARDED_FOR.encode()
        ]
        headers.append((FORWARDED_BY.encode(), cluster.me.gateway_id.encode()))
        if scope.get("client"):
            headers.append((FORWARDED_FOR.encode(), str(scope["client"][0]).encode()))
        target = url + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        try:
            request = client.build_request(scope["method"], target, headers=headers, content=body)
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: safe to go elsewhere
            log.warning("forwarding to %s (%s) failed: %s", owner_id, url, exc)
            return False
        except httpx.TransportError as exc:  # sent, then lost: the client must decide (it may retry)
            log.warning("forwarding to %s (%s) broke: %s", owner_id, url, exc)
            await self._refuse(
                CoordinatorNotAvailableError(
                    f"The connection to the group's coordinator, gateway {owner_id}, broke; retry.",
                    gateway=owner_id,
                ),
                scope,
                _replay(b""),
                send,
            )
            return True
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.headers.multi_items()
                        if k.lower().encode() not in _DROP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()
        return True


def transaction_adder(cluster: Cluster, client: httpx.AsyncClient, auth: AuthSettings) -> RemoteAdd:
    """How this gateway adds partitions and groups to a transaction another gateway coordinates,
    for a client it authenticated (a Kafka write of transaction version 2 that reached a gateway
    leading the partition but not coordinating the id): POST /transactions/{id}/partitions on the
    coordinator, with a key of the client's principal (the coordinator authorizes it again)."""

    async def add(
        principal: Principal,
        tid: str,
        producer_id: int,
        epoch: int,
        partitions: Sequence[tuple[str, int]],
        groups: Sequence[str],
    ) -> None:
        owner = cluster.owner(transaction_resource(tid))
        if owner is None or owner.gateway_id == cluster.me.gateway_id:
            raise NotCoordinatorError(
                f"This gateway does not coordinate transactional id {tid!r} and knows no gateway that does; retry.",
                transactional_id=tid,
            )
        headers = {FORWARDED_BY: cluster.me.gateway_id}
        if auth.enabled:
            key = key_of(auth, principal)
            if key is None:
                raise CoordinatorNotAvailableError(
                    f"No configured key acts as {principal.name!r} with its ACLs to reach the coordinator of "
                    f"{tid!r}; give the gateways the same key file.",
                    transactional_id=tid,
                )
            headers["authorization"] = f"Bearer {key}"
        body = {
            "producer_id": producer_id,
            "producer_epoch": epoch,
            "partitions": [{"topic": t, "partition": p} for t, p in partitions],
            "groups": list(groups),
        }
        url = f"{owner.url}/transactions/{quote(tid, safe='')}/partitions"
        try:
            response = await client.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("adding to transaction %r at %s (%s) failed: %s", tid, owner.gateway_id, owner.url, exc)
            raise CoordinatorNotAvailableError(
                f"The coordinator of transactional id {tid!r}, gateway {owner.gateway_id}, cannot be reached; retry.",
                gateway=owner.gateway_id,
            ) from exc
        if response.status_code != 200:
            try:
                envelope = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                envelope = {"code": CoordinatorNotAvailableError.code, "message": response.text[:300]}
            raise error_of(envelope)

    return add
