"""A gateway's own liveness (broker.cluster): its membership heartbeat runs on a thread of its own,
so requests that hold every thread of the event loop's default executor (commits waiting on a
store's lock, say) never make it miss its heartbeat, count itself out and drop its groups."""

import asyncio
import threading
import time

from broker.cluster import Cluster
from conf import ClusterSettings
from delta_log.system.gateways import GatewayDirectory


def test_a_busy_default_executor_does_not_count_the_gateway_out(storage):
    directory = GatewayDirectory(storage)
    settings = ClusterSettings(gateway_id="gw-a", heartbeat_interval_s=0.1, member_timeout_s=0.6)
    cluster = Cluster(directory, settings, url="http://127.0.0.1/gw-a")
    release = threading.Event()

    async def run() -> list[bool]:
        await cluster.start()
        # every thread of the default executor blocked, as requests queued behind a lock hold them
        busy = [asyncio.to_thread(release.wait, 10) for _ in range(64)]
        tasks = [asyncio.ensure_future(b) for b in busy]
        seen = []
        try:
            for _ in range(15):  # 1.5 s: well past the 0.6 s membership timeout
                await asyncio.sleep(0.1)
                seen.append(cluster.self_live and cluster.owns("group:g"))
        finally:
            release.set()
            await asyncio.gather(*tasks)
            await cluster.stop()
        return seen

    started = time.monotonic()
    seen = asyncio.run(run())
    assert all(seen), seen
    assert time.monotonic() - started < 10
