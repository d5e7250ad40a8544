"""Load tests of a local service: locust scenarios and a light raw-socket client."""
