"""A stand-in pager for the demos: Alertmanager's webhook receiver that logs each page.

``python -m gpufleet.lab.pager --listen 127.0.0.1:9407`` accepts Alertmanager webhook
POSTs and writes one line per alert (``PAGE firing GpuFleetXid79 node=node-040 ...``)
to stdout, so ``docker compose logs pager`` and ``.demo/pager.log`` show what would
have paged someone. It is a demo part, not a notifier: production routes pages
to a real receiver in Alertmanager.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Alertmanager posts at most this much per notification with the demo's grouping.
MAX_BODY_BYTES = 4 * 1024 * 1024
IDENTIFYING_LABELS = ("severity", "node", "training_job", "gpu", "instance")


def page_lines(payload: dict[str, Any]) -> list[str]:
    """One log line per alert in an Alertmanager webhook payload (version 4)."""
    lines = []
    for alert in payload.get("alerts", []):
        labels = alert.get("labels", {})
        shown = " ".join(f"{name}={labels[name]}" for name in IDENTIFYING_LABELS if name in labels)
        summary = alert.get("annotations", {}).get("summary", "")
        lines.append(
            f"PAGE {alert.get('status', '?')} {labels.get('alertname', '?')} {shown} "
            f"receiver={payload.get('receiver', '?')}: {summary}".rstrip()
        )
    return lines


class PagerHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._answer(400, f"expected a JSON body of 1..{MAX_BODY_BYTES} bytes, got {length}")
            return
        try:
            payload = json.loads(self.rfile.read(length))
            if not isinstance(payload, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as error:
            self._answer(400, f"expected an Alertmanager webhook JSON object: {error}")
            return
        for line in page_lines(payload):
            print(line, flush=True)
        self._answer(200, "ok")

    def do_GET(self) -> None:
        # Health checks (compose) and humans: say what this is.
        self._answer(200, "gpufleet pager: POST Alertmanager webhooks here; pages go to the log")

    def _answer(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per page is the log; request lines would bury it


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the pager until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.lab.pager", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:9407", help="HOST:PORT to serve on")
    namespace = parser.parse_args(argv)
    host, _, port = namespace.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen {namespace.listen!r} is not HOST:PORT (for example 127.0.0.1:9407)")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), PagerHandler)
    print(f"gpufleet pager listening on {namespace.listen}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
