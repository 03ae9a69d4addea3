"""One base for the tests' relays. relaykit.base.Relay carries Kafka connections to a real broker;
filters (subclasses: tests/relays.py, tests/txn_relay.py) override its hooks to simulate what the
broker lacks or to inject faults. relaykit.tansu starts the broker a relay fronts."""
