"""A server that reads each request's body and answers 200 `{}`, nothing else: the ceiling the
HTTP transport (uvicorn, uvloop, httptools, loopback TCP, and the load generator on the same cores)
puts under any produce route on this machine.

    python -m uvicorn bench.http_sink:app --host 127.0.0.1 --port P --loop uvloop --http httptools

bench.kafka_bench runs the Arrow IPC load against it beside the gateway (`transport_ceiling`).
"""

from __future__ import annotations

from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})
