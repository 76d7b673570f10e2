"""``kernels_bench.lab.studies.small_confidence`` against a loopback HTTP server that answers
badly: each failure comes back as the row's error (``attempt``), so one bad answer does not
abort the run and lose the rows scored before it."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest

from kernels_bench.lab.studies import small_confidence as conf


ANSWERS = {
    "/bad/tokenize": (500, {"error": "engine died"}),
    "/shape/tokenize": (200, {"not tokens": []}),
    "/ok/tokenize": (200, {"tokens": [1, 2, 3]}),
    "/ok/v1/completions": (200, {"choices": [{"prompt_logprobs": [
        None, {"2": {"logprob": -0.5}}, {"3": {"logprob": -1.5}}]}]}),
}
"""Path -> (status, JSON body) of the server's answer; 404 elsewhere."""


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = ANSWERS.get(self.path, (404, {}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_failed_or_malformed_answer_fails_its_row_alone(server: str) -> None:
    with httpx.Client(timeout=10) as client:
        def row(path: str) -> dict | Exception:
            return conf.attempt(lambda: conf.score_problem(client, server + path, "m", "x"))
        bad, shape, ok = row("/bad"), row("/shape"), row("/ok")
        with socket.socket() as sock:  # a loopback port nothing listens on
            sock.bind(("127.0.0.1", 0))
            closed_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        closed = conf.attempt(lambda: conf.score_problem(client, closed_url, "m", "x"))
    assert isinstance(bad, httpx.HTTPStatusError) and "500" in str(bad)
    assert isinstance(shape, KeyError)
    assert isinstance(closed, httpx.ConnectError)
    assert ok == conf.token_stats([-0.5, -1.5])
