"""A Ray worker node started as ``ray start --address=... --block`` starts one, for a
cluster on 127.0.0.1: the same ``Node(..., shutdown_at_exit=True)`` in this process, which
is what gets SIGTERM (as a Kubernetes pod's main process does) and then has Ray drain the
node before it stops its processes. (``ray start`` itself refuses a second node on
127.0.0.1 without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, and with it dials the machine's
other address: this module skips only that check.)

``python -m tests.integration.ray_worker_node GCS_ADDRESS NUM_CPUS`` prints ``node <id>``
once the node runs, then blocks until SIGTERM.
"""

from __future__ import annotations

import sys
import threading

from ray._private.node import Node
from ray._private.parameter import RayParams


def main() -> None:
    gcs_address, cpus = sys.argv[1], int(sys.argv[2])
    params = RayParams(
        gcs_address=gcs_address,
        node_ip_address="127.0.0.1",
        num_cpus=cpus,
        num_gpus=0,
        object_store_memory=150 << 20,
    )
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(f"node {node.node_id}", flush=True)
    threading.Event().wait()  # as --block: until the SIGTERM handler exits the process


if __name__ == "__main__":
    main()
