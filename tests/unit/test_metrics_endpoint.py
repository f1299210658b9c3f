"""The metrics endpoint's listening socket: IPv4 and IPv6 addresses of metrics_listen."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from pgtask.cluster import free_port
from pgtask.metrics import Endpoint


@pytest.mark.parametrize("host, url_host", [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")])
def test_the_endpoint_serves_on_the_address_family_of_its_host(host, url_host):
    registry = CollectorRegistry()
    Counter("pgtask_probe", "a sample to find", registry=registry).inc()
    port = free_port(host)
    endpoint = Endpoint(f"{url_host}:{port}", registry, lambda: [])
    endpoint.start()
    try:
        with urllib.request.urlopen(f"http://{url_host}:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://{url_host}:{port}/metrics", timeout=5) as resp:
            assert "pgtask_probe_total 1.0" in resp.read().decode()
    finally:
        endpoint.stop()
