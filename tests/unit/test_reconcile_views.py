"""The watched views (reconcile/views.py) and the work queue (reconcile/workqueue.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.reconcile.slim import slim_plain, slim_pod
from sandbox_operator.reconcile.views import Views
from sandbox_operator.reconcile.workqueue import WorkQueue
from sandbox_operator.views import PodView


def sbx(name: str, rv: str, labels: dict[str, str] | None = None, **spec: Any) -> Any:
    return {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": labels or {},
            "annotations": {
                "sandbox-operator.dev/last-handled-configuration": "x" * 10_000,
                "kubectl.kubernetes.io/last-applied-configuration": "y" * 10_000,
                lbl.LAST_ACTIVITY_ANNOTATION: "2099-01-01T00:00:00Z",
            },
        },
        "spec": {"scopeRef": "conv", **spec},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}],
            "egress": {"admitted": "2099-01-01T00:00:00Z", "recent": [{"host": "h"}] * 10},
        },
    }


def test_a_view_keeps_what_reconciling_reads_and_not_the_bulk() -> None:
    views = Views()
    slim = views.put_sandbox(sbx("a", "5"))
    assert slim["metadata"]["annotations"] == {lbl.LAST_ACTIVITY_ANNOTATION: "2099-01-01T00:00:00Z"}
    assert slim["status"]["egress"] == {"admitted": "2099-01-01T00:00:00Z"}
    assert len(repr(slim)) < 1_000


def test_an_older_event_never_replaces_a_newer_write() -> None:
    views = Views()
    views.put_sandbox(sbx("a", "7", image="new"))
    views.put_sandbox(sbx("a", "6", image="old"))  # a late watch event
    assert views.sandboxes.get("ns", "a")["spec"]["image"] == "new"
    # ... unless it is another object under the same name (deleted and re-created)
    other = sbx("a", "3", image="recreated")
    other["metadata"]["uid"] = "uid-other"
    views.put_sandbox(other)
    assert views.sandboxes.get("ns", "a")["spec"]["image"] == "recreated"


def test_the_echo_of_a_write_already_held_is_not_copied_again() -> None:
    """A write's answer goes into the view; its watch event, the same version, then costs no
    slim copy (nor does an older one); a newer version is copied."""
    from sandbox_operator.reconcile.slim import slim_sandbox
    from sandbox_operator.reconcile.views import Store
    from sandbox_operator.views import SandboxView

    copies: list[str] = []

    def counted(obj: Any) -> Any:
        copies.append(obj["metadata"]["resourceVersion"])
        return slim_sandbox(obj)

    store = Store(counted, SandboxView)
    store.upsert(sbx("a", "7", image="new"))  # the write's answer
    held = store.upsert(sbx("a", "7", image="new"))  # its watch event
    store.upsert(sbx("a", "6", image="old"))  # a late event
    assert copies == ["7"] and held["spec"]["image"] == "new"
    store.upsert(sbx("a", "8", image="newer"))
    assert copies == ["7", "8"] and store.get("ns", "a")["spec"]["image"] == "newer"


def test_selection_by_label_and_by_scope_ref_follows_changes() -> None:
    views = Views()
    key = {lbl.KEY_LABEL: "k1", lbl.CONVERSATION_LABEL: "c1"}
    views.put_sandbox(sbx("a", "1", key))
    views.put_sandbox(sbx("b", "1", {lbl.KEY_LABEL: "k2", lbl.CONVERSATION_LABEL: "c1"}))
    assert [o["metadata"]["name"] for o in views.sandboxes.select("ns", lbl.KEY_LABEL, "k1")] == [
        "a"
    ]
    assert len(views.sandboxes.select("ns", lbl.CONVERSATION_LABEL, "c1")) == 2
    assert {o["metadata"]["name"] for o in views.naming_scope("ns", "conv")} == {"a", "b"}
    moved = sbx("a", "2", {lbl.KEY_LABEL: "k3"}, scopeRef="other")
    views.put_sandbox(moved)
    assert views.sandboxes.select("ns", lbl.KEY_LABEL, "k1") == []
    assert [o["metadata"]["name"] for o in views.naming_scope("ns", "conv")] == ["b"]
    views.drop_sandbox("ns", "b", "uid-b")
    assert views.naming_scope("ns", "conv") == []
    assert views.sandboxes.select("ns", lbl.CONVERSATION_LABEL, "c1") == []


def test_children_are_found_by_the_sandbox_label() -> None:
    views = Views()
    pod = {
        "metadata": {
            "name": "sbx-a",
            "namespace": "ns",
            "uid": "p",
            "resourceVersion": "1",
            "labels": {lbl.SANDBOX_LABEL: "a"},
            "ownerReferences": [{"kind": "Sandbox", "name": "a", "uid": "u"}],
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "sandbox", "image": "i"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    views.pods.upsert(pod)
    assert [k for k, _ in views.children("ns", "a")] == ["Pod"]
    assert "containers" not in slim_pod(PodView(pod))["spec"]  # only what classify_pod reads
    views.pods.remove("ns", "sbx-a", "someone-else")  # another object's deletion: kept
    assert views.children("ns", "a")
    views.pods.remove("ns", "sbx-a", "p")
    assert views.children("ns", "a") == []


def test_a_childs_view_keeps_the_labels_of_its_identity() -> None:
    """KeyUnclean reads a child's key and kind labels from the views: a sandbox's identity is
    (key, kind), and a pod of another kind under the key must not hold a sandbox back."""
    labels = {
        lbl.KEY_LABEL: "k",
        lbl.KIND_LABEL: "python",
        lbl.SANDBOX_LABEL: "a",
        lbl.BACKEND_LABEL: "runc",
        "team": "x",
    }
    meta = {"name": "n", "namespace": "ns", "uid": "u", "resourceVersion": "1", "labels": labels}
    for slim in (slim_pod, slim_plain):
        kept = slim(PodView({"metadata": meta, "spec": {}, "status": {}}))["metadata"]["labels"]
        assert kept == {k: v for k, v in labels.items() if k != "team"}


async def test_the_queue_runs_a_key_once_per_burst_and_again_if_added_meanwhile() -> None:
    runs: list[str] = []
    gate = asyncio.Event()

    async def handler(key: str) -> float | None:
        runs.append(key)
        if key == "slow":
            await gate.wait()
        return None

    q: WorkQueue[str] = WorkQueue(handler, workers=4)
    q.start()
    for _ in range(10):
        q.add("a")
    q.add("slow")
    await asyncio.sleep(0.05)
    q.add("slow")  # while it runs: once more afterwards, not concurrently
    q.add("slow")
    assert runs.count("slow") == 1
    gate.set()
    assert await q.drain(2)
    await q.stop()
    assert runs.count("a") == 1 and runs.count("slow") == 2


async def test_a_failing_pass_logs_one_traceback_then_one_line_per_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unavailable(Exception):
        status = 503

    failures: dict[str, BaseException] = {
        "bug": RuntimeError("a fault of ours"),
        "away": ConnectionRefusedError("connection refused"),
        "busy": Unavailable(),
    }
    runs: dict[str, int] = {}

    async def handler(key: str) -> float | None:
        runs[key] = runs.get(key, 0) + 1
        if runs[key] <= 2:
            raise failures[key]
        return None

    q: WorkQueue[str] = WorkQueue(handler, workers=3)
    caplog.set_level(logging.WARNING, logger="sandbox_operator.reconcile.workqueue")
    q.start()
    for key in failures:
        q.add(key)
    await asyncio.sleep(2.0)  # two failures each (backoff 0.5 s, then 1 s), then a success
    await q.stop()
    assert runs == {"bug": 3, "away": 3, "busy": 3}
    traced = [r.getMessage() for r in caplog.records if r.exc_info]
    assert len(traced) == 1 and " bug: " in traced[0]
    lines = [r.getMessage() for r in caplog.records if not r.exc_info]
    assert sum("away" in m for m in lines) == 2 and sum("busy" in m for m in lines) == 2
    assert any("ConnectionRefusedError, 1 in a row" in m for m in lines)
    assert any("RuntimeError, 2 in a row" in m for m in lines)


async def test_deadlines_keep_the_earliest_and_failures_back_off() -> None:
    runs: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    fail = {"n": 1}

    async def handler(key: str) -> float | None:
        runs.append((key, loop.time() - t0))
        if key == "bad" and fail["n"]:
            fail["n"] -= 1
            raise RuntimeError("transient")
        return None

    q: WorkQueue[str] = WorkQueue(handler, workers=2)
    q.start()
    q.add("d", 0.5)
    q.add("d", 0.1)  # earlier: replaces
    q.add("d", 0.3)  # later than the pending one: ignored
    q.add("bad")
    await asyncio.sleep(1.0)
    await q.stop()
    d_runs = [t for k, t in runs if k == "d"]
    assert len(d_runs) == 1 and 0.08 <= d_runs[0] < 0.3
    bad = [t for k, t in runs if k == "bad"]
    assert len(bad) == 2 and bad[1] - bad[0] >= 0.45  # retried after the backoff


async def held_queue() -> tuple[WorkQueue[str], asyncio.Event, list[str]]:
    """A one-worker queue whose worker is held on the key "first" until the event is set; the
    keys in the order they ran."""
    runs: list[str] = []
    gate = asyncio.Event()

    async def handler(key: str) -> float | None:
        if key == "first":
            await gate.wait()
        runs.append(key)
        return None

    q: WorkQueue[str] = WorkQueue(handler, workers=1)
    q.start()
    q.add("first")
    await asyncio.sleep(0.05)  # the only worker is busy with "first"
    return q, gate, runs


async def test_urgent_keys_go_before_the_others_and_each_key_runs_once() -> None:
    q, gate, runs = await held_queue()
    for k in ("new-1", "new-2", "ready-1"):
        q.add(k)
    q.add("ready-1", urgent=True)  # queued already, now urgent: moves ahead, still runs once
    q.add("ready-2", urgent=True)
    gate.set()
    assert await q.drain(2)
    await q.stop()
    assert runs == ["first", "ready-1", "ready-2", "new-1", "new-2"]


async def test_background_keys_go_after_every_other_and_move_up_when_added_again() -> None:
    """(#28 item 5) The resync queues everything it holds as background: a new Sandbox queued
    after it still goes first; a background key added again normally moves up, and runs once."""
    q, gate, runs = await held_queue()
    for k in ("held-1", "held-2", "held-3"):
        q.add(k, background=True)
    q.add("new-1")
    q.add("held-3")  # an event about it: now a normal key
    q.add("ready-1", urgent=True)
    q.add("new-1", background=True)  # a resync does not move a queued key down
    gate.set()
    assert await q.drain(2)
    await q.stop()
    assert runs == ["first", "ready-1", "new-1", "held-3", "held-1", "held-2"]
    with pytest.raises(ValueError, match="either urgent or background"):
        q.add("x", urgent=True, background=True)


def test_a_delete_answer_after_its_deleted_event_leaves_no_ghost() -> None:
    """The watch's DELETED event can come before the delete's own answer (a pod in its grace
    period, deletionTimestamp set). The answer must not put the pod back: no event would ever
    remove it, and every disposal waiting on it would time out."""
    views = Views()
    pod = {
        "metadata": {
            "namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": "5",
            "labels": {lbl.SANDBOX_LABEL: "a"},
        },
        "spec": {}, "status": {"phase": "Pending"},
    }  # fmt: skip
    views.pods.upsert(pod)
    views.pods.remove("ns", "p", "u1")  # the DELETED event
    answer = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2099-01-01T00:00:00Z"}}
    views.pods.upsert(answer)  # the delete's answer, late
    assert views.pods.get("ns", "p") is None
    assert views.pods.select("ns", lbl.SANDBOX_LABEL, "a") == []
    # A new object under the same name (another uid) is taken as usual.
    views.pods.upsert({**pod, "metadata": {**pod["metadata"], "uid": "u2"}})
    assert views.pods.uid_of("ns", "p") == "u2"
