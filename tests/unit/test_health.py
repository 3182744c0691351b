"""Liveness answers on the event loop: a gateway whose worker threads are all busy (long reads,
slow storage) is alive, and an orchestrator probing /healthz must not see it as dead."""

import anyio
import anyio.to_thread
import httpx

from ingest_gateway.app import create_app


def test_healthz_answers_while_every_worker_thread_is_taken():
    async def probe() -> httpx.Response:
        app = create_app()  # no lifespan: /healthz needs no storage
        limiter = anyio.to_thread.current_default_thread_limiter()
        holders = [object() for _ in range(int(limiter.total_tokens))]
        for holder in holders:
            await limiter.acquire_on_behalf_of(holder)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with anyio.fail_after(5):  # a route run on a worker thread waits here for ever
                    return await client.get("/healthz")
        finally:
            for holder in holders:
                limiter.release_on_behalf_of(holder)

    response = anyio.run(probe)
    assert response.status_code == 200 and response.json() == {"status": "ok"}
