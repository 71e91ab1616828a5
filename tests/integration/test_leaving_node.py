"""A worker node that leaves: its ``ray start --block`` gets SIGTERM (as a Kubernetes pod's
main process does), Ray drains the node, the toolkit moves the node's replicas to the other
node, finishes the node's requests and lets it go. And max_replicas_per_node over two
nodes. The cluster runs in its own process (``leaving_node_scenario.py``)."""

from __future__ import annotations

from typing import Any

from tests.integration.leaving_node_scenario import GRACE_S, RAY_DRAIN_S
from tests.scenario import run_scenario


def test_a_node_that_leaves_fails_no_request_and_is_gone_within_the_grace_period() -> None:
    """About 60 s: a two-node cluster of its own, a capped deployment that waits for a
    third node, and a node's drain under load."""
    result: dict[str, Any] = run_scenario("tests.integration.leaving_node_scenario", timeout_s=300)
    head, worker = result["head"], result["worker"]

    capped = result["capped"]
    assert capped["nodes"] == sorted([head, worker])  # one per node
    assert "max_replicas_per_node=1" in capped["message"], capped

    assert sorted(result["replica_nodes_before"]) == sorted([head, worker])
    outcomes = result["outcomes"]
    failed = [o for o in outcomes if o["status"] != 200]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}"
    assert {o["node"] for o in outcomes if o["at"] < 0} == {head, worker}  # both served before
    assert any(o["at"] > result["node_gone_s"] for o in outcomes)  # and the head after
    assert result["draining_seen"] and result["proxy_leaving_s"] is not None
    # Gone well before Ray's own drain deadline would have killed it: as soon as the
    # toolkit's replicas had moved and drained (the grace period) and its proxy stopped.
    assert result["node_gone_s"] < GRACE_S + 10 < RAY_DRAIN_S, result
    assert result["process_exit_s"] < GRACE_S + 12, result
    assert result["replica_nodes_after"] == [head, head]
    assert result["proxies_after"] == [head]
