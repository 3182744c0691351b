"""FastAPI dependencies: settings, the topic registry, metrics, auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from conf import Settings
from delta_log.registry import TopicRegistry
from ingest_gateway.auth import Principal, authenticate
from ingest_gateway.metrics import Metrics


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_registry(request: Request) -> TopicRegistry:
    return request.app.state.registry


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_principal(
    settings: Annotated[Settings, Depends(get_settings)],
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    return authenticate(settings.auth, authorization)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[TopicRegistry, Depends(get_registry)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
