"""Who owns what in a cluster of gateways: rendezvous (highest random weight) hashing. Pure.

Every gateway computes the same owner from the same live-member list, with no messages between
them; when a member joins or leaves, only the resources it gains or loses move (about 1/n each).
Views of the member list can differ for a moment (heartbeats are seen at different times); the
storage fences the loser (see broker.coordinator), so a brief disagreement costs a retry,
never a wrong answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def group_resource(group: str) -> str:
    return f"group:{group}"


def transaction_resource(transactional_id: str) -> str:
    return f"transaction:{transactional_id}"


def partition_resource(topic: str, partition: int) -> str:
    return f"partition:{topic}:{partition}"


def _weight(resource: str, member: str) -> bytes:
    return hashlib.blake2b(f"{resource}\x00{member}".encode("utf-8", "surrogatepass"), digest_size=16).digest()


def owner(resource: str, members: Iterable[str]) -> str | None:
    """The member that owns `resource` (None without members)."""
    return max(members, key=lambda m: (_weight(resource, m), m), default=None)
