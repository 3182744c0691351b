"""HTTP produce load for kill tests, and the check of what survived it."""

from __future__ import annotations

import json
import threading
import time

import httpx


class ProduceLoad:
    """`clients` threads producing requests of 10 records, tagged `c<client>-r<n>`, to `topic`
    until stopped (or their server dies); `acked` holds (tag, offsets) of every answered one."""

    def __init__(self, url: str, topic: str, clients: int = 4) -> None:
        self.url, self.topic = url, topic
        self.acked: list[tuple[str, list[dict]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]

    def _client(self, cid: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            n = 0
            while not self._stop.is_set():
                tag = f"c{cid}-r{n}"
                n += 1
                body = {"records": [{"key": tag, "value": {"tag": tag, "i": i}} for i in range(10)]}
                try:
                    r = c.post(f"/topics/{self.topic}/records", json=body)
                except httpx.TransportError:
                    return
                if r.status_code == 200:
                    with self._lock:
                        self.acked.append((tag, r.json()["offsets"]))

    def start(self) -> ProduceLoad:
        for t in self._threads:
            t.start()
        return self

    def wait_for(self, acks: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < acks and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def all_acked_stored(stored: list[dict], acked: list[tuple[str, list[dict]]]) -> bool:
    """Whether a record of every acked request is stored (what a test waits for before
    `check_acked_once`; a count of rows would not do: requests that failed at the client may be
    stored whole, and count for acked ones that are still on their way)."""
    tags = {json.loads(row["value"])["tag"] for row in stored}
    return all(tag in tags for tag, _ in acked)


def check_acked_once(stored: list[dict], acked: list[tuple[str, list[dict]]], partitions: int) -> None:
    """Every acked record is stored exactly once at its acked offset; an unacked request is
    stored whole or not at all; offsets are contiguous in every partition."""
    by_tag: dict[str, list[dict]] = {}
    for row in stored:
        by_tag.setdefault(json.loads(row["value"])["tag"], []).append(row)
    for tag, offsets in acked:
        got = sorted((r["partition"], r["offset"]) for r in by_tag[tag])
        assert got == sorted((o["partition"], o["offset"]) for o in offsets)
    assert all(len(v) == 10 for v in by_tag.values())
    for p in range(partitions):
        offs = sorted(r["offset"] for r in stored if r["partition"] == p)
        assert offs == list(range(len(offs)))
