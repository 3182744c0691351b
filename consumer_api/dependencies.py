"""Dependencies of the consumer API. The app (ingest_gateway.create_app) provides, on app.state:
`registry` (TopicRegistry), `coordinator` (GroupCoordinator), `notifier` (CommitNotifier) and
`authorize(request, operation, topic)` (raises 401/403 errors). consumer_api never imports the gateway.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from consumer_api.coordinator import GroupCoordinator
from consumer_api.notifier import CommitNotifier
from delta_log.registry import TopicRegistry


def get_registry(request: Request) -> TopicRegistry:
    return request.app.state.registry


def get_coordinator(request: Request) -> GroupCoordinator:
    return request.app.state.coordinator


def get_notifier(request: Request) -> CommitNotifier:
    return request.app.state.notifier


def authorize(request: Request, operation: str, topic: str | None) -> None:
    request.app.state.authorize(request, operation, topic)


RegistryDep = Annotated[TopicRegistry, Depends(get_registry)]
CoordinatorDep = Annotated[GroupCoordinator, Depends(get_coordinator)]
NotifierDep = Annotated[CommitNotifier, Depends(get_notifier)]
