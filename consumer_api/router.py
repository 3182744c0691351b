"""The consumer API router, mounted by the gateway app (one process serves both)."""

from fastapi import APIRouter

from consumer_api.routes import fetch, groups

router = APIRouter()
router.include_router(fetch.router)
router.include_router(groups.router)
