"""Start the toolkit from a short-lived thread, use and stop it from the main one.

Runs in a fresh process (``test_threads.py``): the embedded cluster it starts is its own.
Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import ray
from fastapi import APIRouter

import app_toolkit as tk
from tests import plain_http

router = APIRouter()


@router.get("/where")
def where() -> str:
    return tk.get_replica_context().replica_id


def main(port: int) -> None:
    seen: dict[str, object] = {}
    seen["status_before"] = tk.status().to_dict()
    seen["ray_started_by_status"] = ray.is_initialized()

    def start() -> None:
        tk.start(http_options={"host": "127.0.0.1", "port": port})
        tk.run(tk.App(router, name="threads"), name="threads")

    starter = threading.Thread(target=start)
    starter.start()
    starter.join()
    time.sleep(1.0)  # the starting thread is gone; before the fix, so was the cluster
    seen["http"] = plain_http.get(f"http://127.0.0.1:{port}/where", timeout=30).status_code
    seen["apps"] = sorted(tk.status().applications)
    began = time.monotonic()
    tk.shutdown()
    seen["shutdown_s"] = round(time.monotonic() - began, 2)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
