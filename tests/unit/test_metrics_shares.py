"""vmgpud's metrics of a shared GPU held by time: which GPU, why, and the guests whose work left
their SM spans (vmgpu/metrics.py, from the supervisor's held_by_time)."""

from types import SimpleNamespace

from vmgpu import metrics


def _collect(monkeypatch, held: dict) -> dict:
    ledger = SimpleNamespace(
        usage=lambda: [SimpleNamespace(index=0, uuid="GPU-0"), SimpleNamespace(index=1, uuid="GPU-1")],
        forwarders=lambda: [],
        reservations=lambda g=None: [],
    )
    sup = SimpleNamespace(restarted={}, held_by_time=held)
    collector = metrics.UsageCollector(ledger, metrics.threading.Lock(), sup)
    monkeypatch.setattr(metrics, "_gpu_time", lambda uuid: {})
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in collector.collect()}


def test_a_gpu_held_by_time_is_exported_with_why_and_the_guests_off_their_spans(monkeypatch):
    got = _collect(monkeypatch, {"GPU-1": ("its work off its span", ("vm-c", "vm-d"))})
    assert got["vmgpu_gpu_held_by_time"] == [({"gpu": "1", "uuid": "GPU-1", "why": "its work off its span"}, 1)]
    assert got["vmgpu_guest_off_span"] == [
        ({"guest": "vm-c", "gpu": "1", "uuid": "GPU-1"}, 1),
        ({"guest": "vm-d", "gpu": "1", "uuid": "GPU-1"}, 1),
    ]
    got = _collect(monkeypatch, {"GPU-0": ("more guests at work than groups of SMs", ("a", "b", "c"))})
    assert got["vmgpu_gpu_held_by_time"] == [
        ({"gpu": "0", "uuid": "GPU-0", "why": "more guests at work than groups of SMs"}, 1)
    ]
    assert got["vmgpu_guest_off_span"] == []  # (nobody's work left its span)
    got = _collect(monkeypatch, {})
    assert got["vmgpu_gpu_held_by_time"] == [] and got["vmgpu_guest_off_span"] == []
