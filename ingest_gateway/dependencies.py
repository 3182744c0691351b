"""FastAPI dependencies of the gateway: the shared ones (consumer_api.dependencies) plus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from consumer_api.dependencies import (
    OptionalPrincipalDep,
    PrincipalDep,
    RegistryDep,
    SettingsDep,
    get_principal,
    get_registry,
    get_settings,
)
from ingest_gateway.metrics import Metrics

__all__ = [
    "MetricsDep",
    "OptionalPrincipalDep",
    "PrincipalDep",
    "RegistryDep",
    "SettingsDep",
    "get_principal",
    "get_registry",
    "get_settings",
]


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


MetricsDep = Annotated[Metrics, Depends(get_metrics)]
