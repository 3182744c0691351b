"""The SQL endpoint: Spark's Thrift JDBC/ODBC server on the root's catalog, with the API keys as
logins and their topic ACLs deciding which tables each login sees and reads (docs/SPARK.md)."""
