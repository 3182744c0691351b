"""Produce in a cluster: a request whose partitions another gateway owns is appended by that gateway.

Kafka sends each partition's records to the partition's leader; here any gateway takes the request,
decodes, validates and partitions it, and, when one other gateway owns every partition it touches
(broker.produce.Placement), sends that gateway the prepared records as Arrow with explicit
partitions. The owner authenticates and authorizes the client's key again and appends; one hop only
(`X-Topiclake-Forwarded-By`: the owner never forwards again). So each partition's appends come from
one process and the gateways do not spend their commits on conflicts.

Ownership steers, Delta decides: whoever appends, Delta's transaction rule keeps offsets unique. So
a request that could not be sent (the owner is gone) is appended here, and so is one that was sent
and lost if it is idempotent (the producer's sequence makes the retry a no-op if the owner wrote
it). A lost non-idempotent request is answered 503 OWNER_NOT_AVAILABLE: only the client may decide
to risk a duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import httpx
from fastapi import Response

from broker.produce import AppendResult
from delta_log.core.records import PartitionRange
from delta_log.errors import OwnerNotAvailableError
from ingest_gateway.decoding import ARROW_STREAM
from ingest_gateway.kit.forwarding import FORWARDED_BY

log = logging.getLogger(__name__)

#: the request headers the owner needs: the client's credentials and its producer identity
_PASSED = ("authorization", "producer-id", "producer-sequence", "idempotency-key")
#: the owner's answer headers a refusal keeps
_KEPT = ("content-type", "retry-after", "www-authenticate", "allow")


async def forward_append(
    client: httpx.AsyncClient,
    *,
    url: str,
    owner_id: str,
    me: str,
    topic: str,
    body: bytes,
    headers: Mapping[str, str],
    idempotent: bool,
) -> AppendResult | Response | None:
    """Append `body` (delta_log.core.records.producer_arrow_stream) on the owner at `url`.

    Returns the owner's result; its refusal, to relay as it is; or None when the request should be
    appended here instead (never sent, or idempotent and lost).
    Raises: OwnerNotAvailableError (a non-idempotent request was lost on the way).
    """
    sent = {k: v for k in _PASSED if (v := headers.get(k))}
    sent |= {"content-type": ARROW_STREAM, FORWARDED_BY: me}
    try:
        response = await client.post(f"{url}/topics/{topic}/records", content=body, headers=sent)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: safe to append here
        log.warning("produce to %s: owner %s (%s) cannot be reached, appending here: %s", topic, owner_id, url, exc)
        return None
    except httpx.TransportError as exc:
        if idempotent:
            log.warning("produce to %s: owner %s broke off, appending here (idempotent): %s", topic, owner_id, exc)
            return None
        raise OwnerNotAvailableError(
            f"The connection to gateway {owner_id}, which owns the request's partitions, broke after the "
            "request was sent; the records may or may not be written.",
            gateway=owner_id,
        ) from exc
    if response.status_code != 200:
        kept = {k: v for k, v in response.headers.items() if k.lower() in _KEPT}
        return Response(response.content, status_code=response.status_code, headers=kept)
    answer = response.json()
    return AppendResult(
        ranges=tuple(
            PartitionRange(partition=r["partition"], base_offset=r["base_offset"], count=r["count"])
            for r in answer["partitions"]
        ),
        duplicate=answer["duplicate"],
    )
