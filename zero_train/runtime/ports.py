"""A free TCP port for a rendezvous (MASTER_PORT), without importing torch.

Every launch needs one: single-process runs (two at once must not collide on torch's default 29500),
the profile and bench cells, and the test helper's ranks. Kept apart from `dist` so that the CLI, which
imports this while building its parser, stays free of torch.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now.

    Returns:
        The port number (another process may still take it before it is bound; the window is short).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
