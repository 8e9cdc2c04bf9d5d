"""Hub ids without a network: the local cache first, and one line at once when the hub cannot be reached.

For a name that is not a local folder, transformers asks the hub; with no network, huggingface_hub retries
five times with backoff before it fails (docs/startup.md#the-hub-offline). So `load` tries the
cache first (`local_files_only=True`: a model downloaded once loads offline), then, unless HF_HUB_OFFLINE
forbids asking at all, opens one TCP connection to the hub (HF_ENDPOINT, default huggingface.co) with a short
timeout: unreachable is HubUnreachable within HUB_PROBE_TIMEOUT_S (zero_train.hf.models words the line); reachable, the hub answers (a 404 for an
unknown name comes back at once).
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

HUB_PROBE_TIMEOUT_S = 3.0
"""How long the hub may take to accept a connection (DNS included) before it counts as unreachable."""
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # huggingface_hub's reading of HF_HUB_OFFLINE
Loaded = TypeVar("Loaded")


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: nothing may be downloaded, as huggingface_hub reads it."""
    return any(
        os.environ.get(name, "").upper() in TRUE_VALUES for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_endpoint() -> tuple[str, int]:
    """(host, port) of the hub: HF_ENDPOINT, else huggingface.co:443."""
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def unreachable_reason(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (one TCP connection, DNS included, within `timeout_s`), None if it can.

    The connection runs in a daemon thread: a DNS lookup ignores socket timeouts and can hang far longer.
    """
    host, port = hub_endpoint()
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err.strerror or str(err) or type(err).__name__)

    worker = threading.Thread(target=connect, name="zero_train-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return outcome[0] if outcome else f"no answer within {timeout_s:g} s"


def load(load_from: Callable[..., Loaded], name: str) -> Loaded:
    """`load_from(local_files_only=True)`, else (not cached) `load_from()` if the hub can answer.

    Args:
        load_from: e.g. `functools.partial(AutoConfig.from_pretrained, name)`.
        name: the hub id (or folder).

    Raises:
        OSError: the cache miss under HF_HUB_OFFLINE or for a folder; HubUnreachable (an OSError) when the hub
            cannot be reached; whatever the hub's answer raises otherwise.
    """
    try:
        return load_from(local_files_only=True)
    except OSError:
        if offline_mode() or os.path.isdir(os.path.expanduser(name)):  # a folder's own error, or not allowed
            raise
    reason = unreachable_reason()
    if reason is not None:
        raise HubUnreachable(hub_endpoint()[0], reason)
    return load_from()


class HubUnreachable(OSError):
    """A name that is not cached, and a hub that cannot be reached (the caller words the one line)."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"the hub ({host}) cannot be reached ({reason})")
        self.host = host
        self.reason = reason
