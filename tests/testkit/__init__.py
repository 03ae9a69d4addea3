"""Support shared by the tests and the benchmarks: one way to do each chore they all need.

- testkit.broker   start an in-memory Tansu (on top of kipside.proxy.devbroker, the product's
                   own way), read its version; `TANSU_0_6_0` marks tests of its known bugs.
- testkit.ports    a free loopback port; wait until something listens on one; a connected
                   loopback TCP pair with small kernel buffers.
- testkit.cpu      CPU seconds of a process tree (psutil) and of this process.
- testkit.http     the admin endpoint's HTTP: one h11 client exchange (sans-I/O), curl's answer.
- testkit.metrics  scrape kipside's /metrics and parse it with prometheus_client.parser.
- testkit.produce  confluent-kafka: produce known records, waiting out a full queue, and
                   collect every failed delivery.
- testkit.produce_frames  valid ProduceRequest and ProduceResponse frames (kipside.protocol's
                   writers), for the codec tests and the fuzz tests.
- testkit.kipside  `kipside serve` in front of a broker (or `kipside dev`), ready once it says so
                   and its announced listeners are the ports it was given; its logs, its SIGTERM
                   stop; another install's `kipside` with `binary` and `env`.
- testkit.procs    every child process a harness started, so a watchdog can kill them all.
- testkit.wheel    kipside's wheel, built from a copy of the checkout as `pip install .` builds it.
- testkit.tools    external tools (kcat, chromium, haproxy, tshark, java): a skip or an error that
                   names the missing tool and how to install it.

The tests import it as `testkit` (tests/ is on sys.path through tests/conftest.py); bench/
scripts put the repo's tests/ folder on sys.path first. Nothing here imports pytest at module
level, so the benchmarks can use it; nothing here may talk to anything but loopback.
"""
