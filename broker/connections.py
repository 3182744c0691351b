"""Connection limits shared by every front door: in total and per client address (event-loop
thread only; each face keeps its own guard and settings)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True, kw_only=True)
class ConnectionGuard:
    """Connection counts shared by every connection of one server (event-loop thread only)."""

    max_connections: int
    max_per_client: int
    header_timeout_s: float
    total: int = 0
    per_client: Counter[str] = field(default_factory=Counter)
    refused: int = 0

    def admit(self, client: str) -> str | None:
        """None if the connection may stay, else why not."""
        if self.total >= self.max_connections:
            return f"The server holds its limit of {self.max_connections} connections"
        if self.per_client[client] >= self.max_per_client:
            return f"Your address holds its limit of {self.max_per_client} connections"
        self.total += 1
        self.per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def snapshot(self) -> dict[str, int | float]:
        return {
            "connections": self.total,
            "max_connections": self.max_connections,
            "max_connections_per_client": self.max_per_client,
            "refused_connections": self.refused,
            "header_timeout_s": self.header_timeout_s,
        }
