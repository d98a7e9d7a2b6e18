"""The metric sink keeps training independent of the tracking server: retry, buffer, flush, spill."""

from __future__ import annotations

import json
import logging
import threading

from bert_core.tracking.sink import RetryingSink, fan_out


class FlakyBackend:
    """Fails while ``down`` is set; records what it received."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.received: list[tuple[int, dict]] = []
        self.calls = 0

    def __call__(self, records) -> None:
        self.calls += 1
        if self.down.is_set():
            raise ConnectionError("tracking server unreachable")
        self.received.extend((r.step, r.metrics) for r in records)


def test_metrics_logged_during_an_outage_arrive_in_order_when_the_server_is_back(caplog):
    backend = FlakyBackend()
    sink = RetryingSink(backend, base_delay_s=0.01, max_delay_s=0.05, max_batch=3)
    with caplog.at_level(logging.WARNING, logger="bert_core.tracking.sink"):
        sink(1, {"loss": 1.0})
        assert sink.flush(5)
        backend.down.set()
        for step in range(2, 12):
            sink(step, {"loss": 1.0 / step})  # returns at once although the backend fails
        while backend.calls < 4:  # several failed attempts happen
            threading.Event().wait(0.01)
        assert sink.pending >= 1
        backend.down.clear()
        assert sink.flush(5)
    assert [s for s, _ in backend.received] == list(range(1, 12))
    assert backend.received[-1][1] == {"loss": 1.0 / 11}
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "sending metrics failed" in messages and "reachable again" in messages
    assert sink.close(1) == 0


def test_the_sink_never_blocks_the_caller_on_a_hanging_backend():
    release = threading.Event()
    got = []

    def hanging(records):
        release.wait(10)
        got.extend(records)

    sink = RetryingSink(hanging)
    for step in range(100):
        sink(step, {"x": float(step)})  # would take 100 * 10 s if it waited
    assert sink.pending == 100
    release.set()
    assert sink.flush(5)
    assert len(got) == 100


def test_records_still_unsent_at_close_are_spilled_to_a_file(tmp_path, caplog):
    backend = FlakyBackend()
    backend.down.set()
    spill = tmp_path / "unsent.jsonl"
    sink = RetryingSink(backend, base_delay_s=0.01, max_delay_s=0.02, spill_path=spill)
    sink(5, {"loss": 2.5})
    sink(6, {"loss": 2.0})
    with caplog.at_level(logging.ERROR, logger="bert_core.tracking.sink"):
        assert sink.close(timeout_s=0.2) == 2
    rows = [json.loads(line) for line in spill.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(5, 2.5), (6, 2.0)]
    assert "could not be sent" in caplog.text


def test_fan_out_calls_every_callback():
    seen_a, seen_b = [], []
    cb = fan_out(lambda s, m: seen_a.append(s), None, lambda s, m: seen_b.append(m))
    cb(3, {"a": 1.0})
    assert seen_a == [3] and seen_b == [{"a": 1.0}]
