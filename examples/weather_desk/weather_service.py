"""A small local weather service (stdlib HTTP) that the worker starts for its forecast tool."""

from __future__ import annotations

import json
import threading
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class _Forecasts(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/forecast" or "city" not in query or "day" not in query:
            self.send_error(404)
            return
        seed = sum(map(ord, query["city"])) + date.fromisoformat(query["day"]).toordinal()
        body = json.dumps({"city": query["city"], "day": query["day"],
                           "wind_kmh": 40 + seed % 80, "rain_mm": seed % 50}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


def start() -> tuple[str, ThreadingHTTPServer]:
    """Serve on a free local port in a background thread; returns (base URL, server)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forecasts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
