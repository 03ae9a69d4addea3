# The two commands a newcomer needs: `make run` and `make test`. Both set up what they need
# themselves on a fresh machine: `make run` kipside alone (no extras) and kcat for the README's
# demo; `make test` every extra and every system tool the tests use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two install stamps in the one venv: kipside alone (`make run`), and kipside with every extra
# (everything else). The full install includes the base one and stamps both, so `make run`
# after `make test` installs nothing, and `make test` after `make run` adds the extras.
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: FORCE run test check lint typecheck unit integration bench clean system-deps kcat

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The folders at the top (protocol/, proxy/, rules/, pipeline/) install as kipside.*, so the
# editable install is setuptools' strict mode: a tree of links under build/ that mirrors the
# installed layout (Spark also finds pyspark_kipside there, by listing sys.path). A link tree
# does not see new files, so the install is redone whenever the list of package files changes.
PACKAGES := protocol proxy rules pipeline evidence pyspark_kipside
LAYOUT := $(VENV)/.layout
$(LAYOUT): FORCE | $(BIN)/python
	@find $(PACKAGES) -type f -not -name '*.pyc' -not -path '*/__pycache__/*' | sort > $@.new
	@cmp -s $@.new $@ && rm $@.new || mv $@.new $@

$(STAMP): pyproject.toml $(LAYOUT) | $(BIN)/python
	$(BIN)/python -m pip install -qq -e '.[test,bench,pipeline,columnar,pcap]' --config-settings editable_mode=strict
	touch $(BASE_STAMP) $(STAMP)

$(BASE_STAMP): pyproject.toml $(LAYOUT) | $(BIN)/python
	$(BIN)/python -m pip install -qq -e . --config-settings editable_mode=strict
	touch $(BASE_STAMP)

FORCE:

# From Debian: kcat (a real client for the tests), haproxy (the benchmarks' floor) and libpcap
# (the coalescing test captures loopback traffic with scapy); tcpdump and tshark (the capture
# tests of `kipside pcap`; tshark's question about non-root capture keeps its default, no);
# Java 17 for Spark (the pipelines);
# chromium, if it can be installed, for the status page test (skipped without it).
system-deps:
	@command -v kcat >/dev/null 2>&1 && command -v haproxy >/dev/null 2>&1 \
	  && ldconfig -p | grep -q 'libpcap\.so' || { \
	  echo "installing kcat, haproxy and libpcap from Debian"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq kcat haproxy libpcap0.8 >/dev/null; }
	@command -v tcpdump >/dev/null 2>&1 && command -v tshark >/dev/null 2>&1 || { \
	  echo "installing tcpdump and tshark from Debian (captures, and tshark's Kafka dissector)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "wireshark-common wireshark-common/install-setuid boolean false" \
	    | $$SUDO debconf-set-selections; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq tcpdump tshark >/dev/null; }
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Java 17 from Debian (Spark runs the pipelines)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium from Debian (the status page test runs it headless)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium could not be installed; the status page test will be skipped"; }

# kcat from Debian for the README's demo, if missing; kipside runs without it, so a failed
# install only says so.
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "installing kcat from Debian (the client of the README's demo)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq kcat >/dev/null; } || \
	  echo "kcat could not be installed; kipside runs without it (apt-get install kcat)"; }

run: $(BASE_STAMP) kcat
	$(BIN)/kipside dev

# lint-imports checks the layer contracts in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/ruff format --check protocol proxy rules pipeline evidence pyspark_kipside tests bench

# mypy reads kipside.* from the link tree and names files by their checkout paths. tests/ and
# bench/ are not packages: a second run checks them with their folders on MYPYPATH, as they are
# on sys.path when they run (tests/conftest.py, bench/ scripts), with the same strict settings.
typecheck: $(STAMP)
	@tree=$$($(BIN)/python -c 'import kipside.proxy as p, pathlib; print(pathlib.Path(p.__path__[0]).parents[1])'); \
	MYPYPATH=$$tree $(BIN)/mypy > $(VENV)/.mypy.out; rc=$$?; \
	MYPYPATH=$$tree:tests:bench $(BIN)/mypy tests bench >> $(VENV)/.mypy.out || rc=1; \
	sed -e "s#$$tree/kipside/##" -e "s#$$tree/##" $(VENV)/.mypy.out; exit $$rc

unit: $(STAMP)
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

integration: $(STAMP) system-deps
	$(BIN)/pytest -m integration $(PYTEST_ARGS)

test: $(STAMP) system-deps lint typecheck
	$(BIN)/pytest $(PYTEST_ARGS)

# Every benchmark in turn; each rewrites its section of docs/performance.md. One of them:
# `make bench BENCH=coalesce`; a smoke run that writes nothing: `make bench BENCH_ARGS="--quick --no-doc"`.
BENCH ?= throughput coalesce txn tracing_cost counting_cost hotpath mirror lake
bench: $(STAMP) system-deps
	for b in $(BENCH); do $(BIN)/python bench/$$b.py $(BENCH_ARGS) || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
