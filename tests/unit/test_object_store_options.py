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
