"""benchmarks/proc_cpu.py: the per-process CPU readings http_overhead --per-process prints."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.proc_cpu import cpu_by_process, cpu_spent, process_label


def test_cpu_spent_adds_up_each_label_and_counts_new_processes_from_zero() -> None:
    before = {1: ("ReplicaActor", 1.0), 2: ("ReplicaActor", 2.0), 3: ("raylet", 5.0), 4: ("gone", 9.0)}
    after = {1: ("ReplicaActor", 1.5), 2: ("ReplicaActor", 2.25), 3: ("raylet", 5.0), 5: ("python", 0.5)}
    assert cpu_spent(before, after) == {"ReplicaActor": 0.75, "raylet": 0.0, "python": 0.5}


def test_a_process_tree_is_read_with_labels_and_the_cpu_it_spends(tmp_path: Path) -> None:
    script = tmp_path / "busy_child.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass
            print("done", flush=True)
            sys.stdin.read()  # stays alive until the test lets it go
            """
        )
    )
    child = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert process_label(child.pid) == "busy_child"  # python SCRIPT: named by its script
        reading = cpu_by_process(child.pid)
        label, seconds = reading[child.pid]
        assert label == "busy_child" and seconds >= 0.25
    finally:
        child.communicate("", timeout=30)
    assert process_label(child.pid) == ""  # gone
