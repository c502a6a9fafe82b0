# Shortcuts only: every target is a cargo or redis-server command you could type yourself. `make help` lists them.

PORT ?= 6379
MODULE := target/release/libredis_tb.so
REDIS_SERVER ?= redis-server

.PHONY: help deps build run test unit integration lint bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what a fresh Debian machine lacks (redis-server, libclang for bindgen)
	@bash scripts/deps.sh

build: deps ## Build the module: target/release/libredis_tb.so
	cargo build --release

run: build ## Start redis-server in the foreground with the module loaded (PORT=6379)
	$(REDIS_SERVER) --port $(PORT) --save "" --appendonly no --loadmodule $(CURDIR)/$(MODULE)

test: build ## Unit, property and integration tests (integration tests spawn their own servers)
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) cargo test --all-targets

lint: deps ## cargo fmt --check, clippy -D warnings, and the purity check on src/bucket.rs and src/codec.rs
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	@! grep -nE 'redis_module::|use redis_module|SystemTime::|Instant::|clock_gettime|libc::' src/bucket.rs src/bucket/*.rs src/codec.rs \
		|| (echo "src/bucket.rs and src/codec.rs must stay pure: no redis_module, no clock"; exit 1)

bench: build ## Criterion benches, then TB.ACQUIRE vs HSET, INCR and a Lua bucket on a spawned server (~2 min)
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) python3 scripts/bench.py

clean: ## Remove build output
	cargo clean
