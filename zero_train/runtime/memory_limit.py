"""What memory a rank may hold, how much of it it uses, and whether an error says it ran out.

A CPU rank can be stopped by three limits, the first to bind wins:

- RLIMIT_DATA (`prlimit --data=BYTES`, `ulimit -d`): the process's private writable memory (VmData) may not
  grow past it; torch's allocator then raises "DefaultCPUAllocator: can't allocate memory", Python MemoryError.
- its cgroup's memory.max (a container, a systemd slice, a scheduler's job), shared by the ranks in it: the
  kernel's out-of-memory killer SIGKILLs one of them (resident memory).
- the host's memory, shared by the ranks on it: the same killer.

A CUDA rank has its GPU's memory (torch.cuda.OutOfMemoryError). `rank_limit` names the binding one per rank, and
`used_bytes` reads the matching measure (VmData for RLIMIT_DATA, resident memory otherwise), so that the start of
a run (the interpreter and libraries, before the model) can be taken off what the model may use.
"""

from __future__ import annotations

import os
import pathlib
import resource

OUT_OF_MEMORY_HINTS = (
    "out of memory",  # torch.cuda.OutOfMemoryError, "CUDA error: out of memory"
    "can't allocate memory",  # torch's DefaultCPUAllocator under RLIMIT_DATA or overcommit
    "cannot allocate memory",  # ENOMEM from the C library (mmap, fork)
    "bad_alloc",  # a C++ allocation in gloo or a kernel
)


def is_out_of_memory(err: BaseException) -> bool:
    """True for MemoryError, torch's OutOfMemoryError and errors whose text says an allocation failed."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    if not isinstance(err, (RuntimeError, OSError)):
        return False
    text = str(err).lower()
    return any(hint in text for hint in OUT_OF_MEMORY_HINTS)


def proc_status() -> dict[str, int]:
    """VmData, VmRSS, VmHWM of this process in bytes (from /proc/self/status; {} where there is none)."""
    values = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in ("VmData", "VmRSS", "VmHWM"):
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return values


def rank_limit(local_ranks: int, device: str = "cpu") -> dict:
    """The limit that binds this rank first: {"kind", "bytes", "measure"} (measure: "VmData" or "VmRSS").

    Args:
        local_ranks: ranks sharing this host (and its cgroup): a shared limit is split evenly among them.
        device: "cuda" reads the GPU's memory instead (torch.cuda.mem_get_info).
    """
    if device == "cuda":
        import torch  # expensive: torch; every usage error imports this module (errors -> faults -> vitals)

        return dict(kind="the GPU's memory", bytes=int(torch.cuda.mem_get_info()[1]), measure="cuda")
    candidates = []
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY:
        candidates.append(dict(kind="RLIMIT_DATA", bytes=int(soft), measure="VmData"))
    cgroup = _cgroup_limit()
    if cgroup is not None:
        candidates.append(
            dict(
                kind=f"the cgroup's memory.max / {local_ranks} ranks",
                bytes=cgroup // max(local_ranks, 1),
                measure="VmRSS",
            )
        )
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    candidates.append(
        dict(
            kind=f"the host's memory / {local_ranks} ranks",
            bytes=host // max(local_ranks, 1),
            measure="VmRSS",
        )
    )
    return min(candidates, key=lambda limit: limit["bytes"])


def used_bytes(measure: str) -> int:
    """This process's use in the limit's measure (VmData, VmRSS; 0 for "cuda": the allocator says it)."""
    return proc_status().get(measure, 0)


def _cgroup_limit() -> int | None:
    """This process's cgroup v2 memory.max in bytes, None when unlimited or unreadable."""
    try:
        line = pathlib.Path("/proc/self/cgroup").read_text().splitlines()[0]
        path = pathlib.Path("/sys/fs/cgroup") / line.split("::", 1)[1].lstrip("/") / "memory.max"
        text = path.read_text().strip()
    except (OSError, IndexError):
        return None
    return None if text == "max" else int(text)
