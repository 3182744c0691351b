import pytest

from conf import load_settings


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One SparkSession with delta-spark for the whole test run."""
    from delta_log.spark import get_spark

    warehouse = tmp_path_factory.mktemp("warehouse")
    settings = load_settings(spark={"master": "local[2]", "conf": {"spark.sql.warehouse.dir": str(warehouse)}})
    session = get_spark(settings, app_name="topiclake-tests")
    yield session
    session.stop()
