import pytest
from pydantic import SecretStr

from conf import ApiKeySettings, AuthSettings
from delta_log.core.acl import (
    authenticate,
    authorize,
    authorize_group,
    kafka_operations,
    legacy_group_acls,
    principal_of,
)
from delta_log.errors import AuthenticationError, AuthorizationError, all_error_classes
from ingest_gateway.kit.errors import STATUS, status_for

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
        assert cls in STATUS, f"{cls.__name__} has no HTTP status in ingest_gateway.kit.errors.STATUS"
    assert status_for(AuthenticationError()) == 401


def test_group_acls_follow_kafka():
    keys = AuthSettings(
        api_keys=[
            ApiKeySettings(
                key=SecretStr("app-key"), principal="app", acls={"orders-*": ["consume"]}, groups={"app-*": ["read"]}
            ),
            ApiKeySettings(
                key=SecretStr("mon-key"), principal="mon", acls={"*": ["describe"]}, groups={"*": ["describe"]}
            ),
        ]
    )
    app = authenticate(keys, "Bearer app-key")
    authorize_group(app, "read", "app-1")
    authorize_group(app, "describe", "app-1")  # read implies describe
    with pytest.raises(AuthorizationError):
        authorize_group(app, "read", "billing")
    mon = authenticate(keys, "Bearer mon-key")
    authorize_group(mon, "describe", "billing")
    authorize(mon, "describe", "payments")
    with pytest.raises(AuthorizationError):
        authorize_group(mon, "read", "billing")
    with pytest.raises(AuthorizationError):
        authorize(mon, "consume", "payments")


def test_key_files_without_group_acls_keep_working():
    etl = authenticate(AUTH, "Bearer etl-key")  # consume on orders-*: read on every group, as before
    authorize_group(etl, "read", "any-group")
    producer_only = authenticate(
        AuthSettings(api_keys=[ApiKeySettings(key=SecretStr("p"), principal="p", acls={"*": ["produce"]})]), "Bearer p"
    )
    with pytest.raises(AuthorizationError):
        authorize_group(producer_only, "describe", "any-group")
    assert legacy_group_acls({"x": ["produce"]}) == {}


def test_authorized_operations_are_kafkas_bits_for_each_kind_of_key():
    """The bit sets Kafka 4.3.1 reports for the same rights (tests/e2e/kafka_refusals.json)."""
    keys = {
        "nobody": ({}, {}),
        "monitor": ({"orders-*": ["describe"]}, {"*": ["describe"]}),
        "consumer": ({"orders-*": ["consume"]}, {"orders-*": ["read"]}),
        "producer": ({"orders-*": ["produce"]}, {}),
        "owner": ({"orders-*": ["admin"]}, {"orders-*": ["admin"]}),
        "admin": ({"*": ["admin"]}, {"*": ["admin"]}),
    }
    got = {
        name: tuple(
            kafka_operations(principal_of(name, topics, groups), kind, resource)
            for kind, resource in (("topic", "orders-a"), ("topic", "secret-a"), ("group", "orders-g"), ("cluster", ""))
        )
        for name, (topics, groups) in keys.items()
    }
    assert got == {
        "nobody": (0, 0, 0, 0),
        "monitor": (1280, 0, 1280, 0),  # DESCRIBE, DESCRIBE_CONFIGS
        "consumer": (1288, 0, 1288, 0),  # and READ
        "producer": (1296, 0, 0, 0),  # DESCRIBE, DESCRIBE_CONFIGS, WRITE
        "owner": (3576, 0, 3400, 256),  # all of a topic's, all of a group's; DESCRIBE on the cluster
        "admin": (3576, 3576, 3400, 8096),
    }
