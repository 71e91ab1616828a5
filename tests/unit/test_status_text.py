"""status().to_text(): the table `app-toolkit status` prints."""

from __future__ import annotations

from app_toolkit.status import (
    ApplicationStatus,
    ApplicationStatusInfo,
    AutoscalingStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    EventInfo,
    ProxyStatus,
    ReplicaState,
    ReplicaStatusInfo,
    ServeStatus,
    UpgradeStatusInfo,
)


def _replica(state: ReplicaState) -> ReplicaStatusInfo:
    return ReplicaStatusInfo(f"r-{state.value}", state, "v1", "node-a")


def test_the_table_explains_each_deployment() -> None:
    scaled = DeploymentStatusInfo(
        "Model",
        DeploymentStatus.UPDATING,
        "",
        4,
        [_replica(ReplicaState.RUNNING), _replica(ReplicaState.RUNNING), _replica(ReplicaState.STARTING)],
        AutoscalingStatusInfo(
            current_load=7.0,
            average_load=6.42,
            last_decision_load=6.2,
            last_decision_from=2,
            last_decision_to=4,
            last_decision_age_s=3.4,
        ),
    )
    fixed = DeploymentStatusInfo("Ingress", DeploymentStatus.HEALTHY, "", 1, [_replica(ReplicaState.RUNNING)])
    failed = DeploymentStatusInfo(
        "Broken", DeploymentStatus.DEPLOY_FAILED, "ValueError: model file missing", 1
    )
    status = ServeStatus(
        {
            "shop": ApplicationStatusInfo(
                "shop",
                ApplicationStatus.DEPLOYING,
                "",
                "/shop",
                "Ingress",
                {"Ingress": fixed, "Model": scaled, "Broken": failed},
            ),
            "jobs": ApplicationStatusInfo("jobs", ApplicationStatus.RUNNING, "", None, "Ingress", {}),
        },
        proxies={"0123456789abcdef": ProxyStatus.HEALTHY},
        proxy_urls={"0123456789abcdef": "http://127.0.0.1:8000"},
    )
    lines = status.to_text().splitlines()
    assert lines[0] == "shop  DEPLOYING  /shop"
    assert lines[1].split() == ["DEPLOYMENT", "STATUS", "REPLICAS", "STATES", "LOAD", "LAST", "SCALING"]
    assert lines[2].split() == ["Ingress", "HEALTHY", "1/1", "1", "RUNNING", "-", "-"]
    assert lines[3].split() == [
        "Model",
        "UPDATING",
        "2/4",
        "2",
        "RUNNING,",
        "1",
        "STARTING",
        "7",
        "(avg",
        "6.4)",
        "2",
        "->",
        "4",
        "at",
        "load",
        "6.2,",
        "3",
        "s",
        "ago",
    ]
    assert lines[4].split()[:4] == ["Broken", "DEPLOY_FAILED", "0/1", "-"]
    assert lines[5] == "  Broken: ValueError: model file missing"
    assert lines[6] == "jobs  RUNNING  (no HTTP)"
    assert lines[-1] == "proxy http://127.0.0.1:8000  HEALTHY  (node 0123456789ab)"
    # Columns line up: every cell of a column starts at the same offset.
    assert lines[2].index("HEALTHY") == lines[3].index("UPDATING") == lines[1].index("STATUS")


def test_nothing_running_says_so() -> None:
    assert ServeStatus().to_text() == "No applications."


def test_recent_problems_follow_the_table_and_routine_events_do_not() -> None:
    at = 1_700_000_000.0
    events = [
        EventInfo(at, "INFO", "shop/Model: 1 -> 2 replicas for an average load of 3.0"),
        *(EventInfo(at + i, "WARNING", f"Replica r{i} is gone (killed); replacing it") for i in range(7)),
        EventInfo(at + 9, "ERROR", "shop/Broken failed to deploy: ValueError: x"),
    ]
    lines = ServeStatus(events=events).to_text().splitlines()
    assert lines[:2] == ["No applications.", "Recent problems:"]
    shown = lines[2:]
    assert len(shown) == 5 and not any("average load" in line for line in shown)
    assert shown[-1].split(maxsplit=2)[1:] == ["ERROR", "shop/Broken failed to deploy: ValueError: x"]
    assert "r6" in shown[-2] and "r3" in shown[0]  # the newest five


def test_an_upgrade_says_its_counts_mode_step_and_wait_and_the_capacity_shows() -> None:
    upgrade = UpgradeStatusInfo(
        to_version="3f2a9c1d",
        old_replicas=1,
        new_replicas=1,
        target_replicas=2,
        mode="steps",
        step=2,
        steps=2,
        step_size=1,
        waiting_for="1 replica needs {'accel': 1.0}: none free",
        age_s=12.0,
    )
    model = DeploymentStatusInfo(
        "Model", DeploymentStatus.UPDATING, "", 2, [_replica(ReplicaState.RUNNING)], upgrade=upgrade
    )
    app = ApplicationStatusInfo("chat", ApplicationStatus.DEPLOYING, "", "/", "Model", {"Model": model})
    text = ServeStatus({"chat": app}, target_capacity=50, draining_nodes=["abcdef0123456789"]).to_text()
    assert (
        "  Model: upgrade to 3f2a9c1d: 1 new and 1 old running, of 2; steps, step 2 of 2 "
        "(1 replica each); waiting for 1 replica needs {'accel': 1.0}: none free"
    ) in text.splitlines()
    assert "target capacity: 50 %" in text
    assert "node abcdef012345 is leaving: its replicas move to other nodes" in text


def test_a_custom_policy_decision_names_the_policy_and_the_metrics_it_saw() -> None:
    scaled = DeploymentStatusInfo(
        "Model",
        DeploymentStatus.HEALTHY,
        "",
        3,
        [_replica(ReplicaState.RUNNING)],
        AutoscalingStatusInfo(
            current_load=0.0,
            average_load=0.0,
            last_decision_load=0.0,
            last_decision_from=1,
            last_decision_to=3,
            last_decision_age_s=2.0,
            policy="policies:scale_on_queue",
            last_decision_metrics={"queue": {"r1": 7.0, "r2": 2.5}},
        ),
    )
    app = ApplicationStatusInfo("shop", ApplicationStatus.RUNNING, "", "/", "Model", {"Model": scaled})
    text = ServeStatus({"shop": app}).to_text()
    assert (
        "1 -> 3 at load 0.0, 2 s ago on queue up to 7 (2 replicas) (policy policies:scale_on_queue)" in text
    )
