"""Hub ids without a network (zero_train.hf.hub): the cache first, then one TCP probe of the hub, measured against
real sockets on this machine (a listener that accepts, a port nobody listens on), never the real hub."""

from __future__ import annotations

import socket
import time

import pytest

from zero_train.hf import hub

pytestmark = pytest.mark.tier("quick")


@pytest.fixture
def listener():
    """A port on 127.0.0.1 that accepts connections, and one that refuses them (bound, never listening)."""
    with socket.socket() as open_port, socket.socket() as closed_port:
        open_port.bind(("127.0.0.1", 0))
        open_port.listen()
        closed_port.bind(("127.0.0.1", 0))
        yield open_port.getsockname()[1], closed_port.getsockname()[1]


def test_the_endpoint_is_hf_endpoint_else_huggingface_co(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert hub.hub_endpoint() == ("huggingface.co", 443)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.local")
    assert hub.hub_endpoint() == ("mirror.local", 80)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.local:8443/")
    assert hub.hub_endpoint() == ("mirror.local", 8443)


def test_a_hub_that_accepts_is_reachable_and_a_refused_one_says_why_at_once(monkeypatch, listener):
    open_port, closed_port = listener
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{open_port}")
    assert hub.unreachable_reason(timeout_s=2.0) is None
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    started = time.monotonic()
    reason = hub.unreachable_reason(timeout_s=2.0)
    assert reason is not None and "refused" in reason.lower()
    assert time.monotonic() - started < 2.0  # a refusal is an answer: no waiting out the timeout


def test_load_reads_the_cache_first_and_asks_the_hub_only_on_a_miss(monkeypatch, listener):
    open_port, closed_port = listener
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def cached(**kwargs):
        calls.append(kwargs)
        return "from cache"

    assert hub.load(cached, "org/model") == "from cache"
    assert calls == [dict(local_files_only=True)]  # cached: the hub is never asked

    def miss(**kwargs):
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise OSError("not in the cache")
        return "from the hub"

    calls.clear()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{open_port}")
    assert hub.load(miss, "org/model") == "from the hub"
    assert calls == [dict(local_files_only=True), {}]

    calls.clear()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    with pytest.raises(hub.HubUnreachable, match=r"the hub \(127\.0\.0\.1\) cannot be reached") as raised:
        hub.load(miss, "org/model")
    assert isinstance(raised.value, OSError) and calls == [dict(local_files_only=True)]

    calls.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the cache miss itself, no probe
    with pytest.raises(OSError, match="not in the cache"):
        hub.load(miss, "org/model")
    assert calls == [dict(local_files_only=True)]


def test_a_folder_that_is_not_a_model_keeps_its_own_error(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # never probed: a folder is not a hub id

    def miss(**kwargs):
        raise OSError(f"{tmp_path} has no config.json")

    with pytest.raises(OSError, match="has no config.json"):
        hub.load(miss, str(tmp_path))
