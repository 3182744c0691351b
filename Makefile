# topiclake: `make run` (set up + serve on ./data) and `make test` (set up + whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JARS_STAMP := $(VENV)/.delta-jars

.PHONY: FORCE setup minio go-clients kafka-jars chromium sql-endpoint run test test-fast lint bench clean

# The Kafka codec (kafka_gateway/codec) and the roll-up's parquet merge (delta_log/table/parquet_merge),
# both Rust, are compiled by this install (setuptools-rust, cargo); their build directory is cached
# under ~/.cache, so a fresh clone rebuilds only what changed.
CODEC_SRC := kafka_gateway/codec/Cargo.toml $(wildcard kafka_gateway/codec/src/*.rs) \
	delta_log/table/parquet_merge/Cargo.toml $(wildcard delta_log/table/parquet_merge/src/*.rs)
export CARGO_TARGET_DIR ?= $(HOME)/.cache/topiclake/cargo-target

$(STAMP): pyproject.toml $(CODEC_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Delta's JVM jars: resolved once from Maven Central by Spark's own package resolution (Ivy cache).
$(JARS_STAMP): $(STAMP) delta_log/spark/warmup.py
	$(PY) -m delta_log.spark.warmup
	touch $(JARS_STAMP)

# A real S3 server for tests/s3: MinIO built from its Go module at a pinned version, once (cached
# under ~/.cache). Without Go the S3 tests are skipped and say why (CI requires them).
minio: $(STAMP)
	@if command -v go >/dev/null; then $(PY) -m tests.s3.minio build; else $(PY) -m tests.s3.minio check; fi

# Go's Kafka clients (franz-go, sarama, kafka-go) for the listener's tests: built from
# tests/e2e/go_clients at the versions its go.mod pins, cached under ~/.cache (Go's module cache too).
go-clients: $(STAMP)
	@if command -v go >/dev/null; then $(PY) -m tests.e2e.go_kafka_clients build; else $(PY) -m tests.e2e.go_kafka_clients check; fi

# Kafka's broker and tools (the Kafka listener's tests run Kafka's own Java tools; the benchmarks
# run the broker): resolved once from Maven Central through Maven into ~/.cache (bench/kafka/pom.xml).
kafka-jars: $(STAMP)
	$(PY) -c "from bench.kafka_broker import ensure_jars; print(ensure_jars())"

# Our Java classes (the catalog's metastore launcher, the SQL endpoint's logins and table access),
# compiled against pyspark's jars with the JDK's javac, and the list of jars Spark's packages resolve
# to for the SQL endpoint; cached under ~/.cache.
sql-endpoint: $(JARS_STAMP)
	$(PY) -m delta_log.spark.java_build
	$(PY) -m sql_endpoint.build

# The console's charting library, from npm at a pinned version (no CDN at run time); the download
# is cached under ~/.cache, and no lock file is kept.
CHARTJS_VERSION := 4.6.1
CONSOLE_NPM := $(HOME)/.cache/topiclake/console-npm
CHART_JS := console/static/vendor/chart.umd.min.js
CHART_STAMP := console/static/vendor/.chart.js-$(CHARTJS_VERSION)

# (fetched again when the pinned version changes, or the file is gone; --prefix keeps npm in its cache
# folder even when a package.json or node_modules lies above it)
$(CHART_STAMP): $(if $(wildcard $(CHART_JS)),,FORCE)
	@command -v npm >/dev/null || { echo "npm (Node.js) fetches the console's chart library: install Node.js with npm, then run make again." >&2; exit 1; }
	mkdir -p $(CONSOLE_NPM) console/static/vendor
	npm install --prefix $(CONSOLE_NPM) --no-package-lock --no-save --no-audit --no-fund --silent chart.js@$(CHARTJS_VERSION)
	cp $(CONSOLE_NPM)/node_modules/chart.js/dist/chart.umd.min.js $(CHART_JS)
	rm -f console/static/vendor/.chart.js-* && touch $(CHART_STAMP)

FORCE:

# Swagger UI for the API's /docs page, the same way (no CDN at run time).
SWAGGER_VERSION := 5.35.0
SWAGGER_DIR := ingest_gateway/static/swagger
SWAGGER_STAMP := $(SWAGGER_DIR)/.swagger-ui-$(SWAGGER_VERSION)

$(SWAGGER_STAMP): $(if $(wildcard $(SWAGGER_DIR)/swagger-ui-bundle.js),,FORCE)
	@command -v npm >/dev/null || { echo "npm (Node.js) fetches Swagger UI for /docs: install Node.js with npm, then run make again." >&2; exit 1; }
	mkdir -p $(CONSOLE_NPM) $(SWAGGER_DIR)
	npm install --prefix $(CONSOLE_NPM) --no-package-lock --no-save --no-audit --no-fund --silent swagger-ui-dist@$(SWAGGER_VERSION)
	cp $(CONSOLE_NPM)/node_modules/swagger-ui-dist/swagger-ui-bundle.js $(CONSOLE_NPM)/node_modules/swagger-ui-dist/swagger-ui.css $(SWAGGER_DIR)/
	rm -f $(SWAGGER_DIR)/.swagger-ui-* && touch $(SWAGGER_STAMP)

# Debian's chromium and its chromedriver, for the console's browser tests (tests/console).
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

setup: $(STAMP) $(JARS_STAMP) $(CHART_STAMP) $(SWAGGER_STAMP) minio go-clients kafka-jars chromium sql-endpoint

run: $(STAMP) $(CHART_STAMP) $(SWAGGER_STAMP)
	$(VENV)/bin/topiclake serve --host $${TOPICLAKE_HOST:-127.0.0.1} --port $${TOPICLAKE_PORT:-8080} --root $${TOPICLAKE_ROOT:-./data}

# The suite on a worker a core (pytest-xdist; tests/conftest.py keeps the shared SparkSession's
# tests on one worker and each other module's tests on one): TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

test-fast: $(STAMP) $(CHART_STAMP) $(SWAGGER_STAMP)
	$(PY) -m pytest -q -m "not spark and not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Every benchmark side by side (Kafka from Maven Central, confluent-kafka): results, table, plots.
bench: setup
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
