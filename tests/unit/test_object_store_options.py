from conf import load_settings
from conf.settings import AWS_ENVIRONMENT, object_store_options


def test_an_s3_root_takes_the_aws_environment_for_what_settings_leave_out(monkeypatch):
    for name in AWS_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    opts = object_store_options("s3://b/p", {"aws_region": "us-east-1"})
    assert opts == {
        "AWS_ACCESS_KEY_ID": "from-env",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    }
    assert object_store_options("./data", {}) == {}  # a local root reads no AWS variable
    s = load_settings(root="s3://b/p", jobs={"replica_root": "s3://r/p"})
    assert s.storage_options["AWS_REGION"] == "eu-west-1"
    assert s.jobs.replica_storage_options["AWS_ACCESS_KEY_ID"] == "from-env"


def test_credentials_come_from_settings_or_the_environment_never_mixed(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    mine = object_store_options("s3://b/p", {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert "AWS_SESSION_TOKEN" not in mine and mine["AWS_ACCESS_KEY_ID"] == "k"
    assert object_store_options("s3://b/p", {})["AWS_SESSION_TOKEN"] == "env-token"
