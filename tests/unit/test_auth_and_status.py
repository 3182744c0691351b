import pytest
from pydantic import SecretStr

from conf import ApiKeySettings, AuthSettings
from delta_log.core.acl import authenticate, authorize
from delta_log.errors import AuthenticationError, AuthorizationError, all_error_classes
from ingest_gateway.errors import STATUS, status_for

AUTH = AuthSettings(
    api_keys=[
        ApiKeySettings(key=SecretStr("etl-key"), principal="etl", acls={"orders-*": ["produce", "consume"]}),
        ApiKeySettings(key=SecretStr("ops-key"), principal="ops", acls={"*": ["admin"]}),
    ]
)


def test_auth_off_without_keys():
    p = authenticate(AuthSettings(), None)
    authorize(p, "admin", "anything")


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer wrong"])
def test_unauthenticated(header):
    with pytest.raises(AuthenticationError):
        authenticate(AUTH, header)


def test_acls():
    etl = authenticate(AUTH, "Bearer etl-key")
    authorize(etl, "produce", "orders-eu")
    authorize(etl, "consume", "orders-eu")
    with pytest.raises(AuthorizationError):
        authorize(etl, "admin", "orders-eu")
    with pytest.raises(AuthorizationError):
        authorize(etl, "produce", "payments")
    ops = authenticate(AUTH, "Bearer ops-key")
    authorize(ops, "produce", "payments")  # admin implies the rest


def test_every_error_class_has_a_status():
    for cls in all_error_classes():
        assert cls in STATUS, f"{cls.__name__} has no HTTP status in ingest_gateway.errors.STATUS"
    assert status_for(AuthenticationError()) == 401
