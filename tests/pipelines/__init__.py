"""End-to-end tests of the Spark pipelines (mirror, lake, the kipside source) with real brokers."""
