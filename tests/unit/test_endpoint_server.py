"""The endpoint's HTTP server accepts every agent of a rollout connecting at once."""

from __future__ import annotations

import socket

from posttrain.endpoint.server import EndpointServer


def test_listen_backlog_holds_a_rollouts_agents_connecting_at_once():
    """64 clients connect while the server accepts nothing yet (its thread not started): all 64 are
    queued by the kernel. With socketserver's default backlog of 5, the 7th and later connects got no
    answer (their SYNs dropped, retried by TCP after 1 s), which split the rollout's first batch."""
    server = EndpointServer(app=None)  # type: ignore[arg-type]  # no request is served
    host, port = server.httpd.server_address[:2]
    clients = []
    try:
        for _ in range(64):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.settimeout(0.5)
            clients.append(client)
            client.connect((host, port))  # times out when the backlog is full
    finally:
        for client in clients:
            client.close()
        server.close()
    assert len(clients) == 64
