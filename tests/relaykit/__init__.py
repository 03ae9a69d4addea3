"""One base for the tests' relays. relaykit.base.Relay carries Kafka connections to a real broker;
filters (subclasses: tests/relays.py, tests/txn_relay.py, tests/pipelines/fault_relays.py)
override its hooks to simulate what the broker lacks or to inject faults.
relaykit.tansu.tansu_behind(relay) puts a fresh Tansu behind a relay."""
