"""Communication per optimizer step: the measured collectives next to the ZeRO paper's volume.

The CommLedger (zero_train.comm.ledger) records the PAYLOAD of every collective a rank issues (an
all-reduce of T bytes counts T; a point-to-point message counts on the sender and on the receiver).
The paper counts VOLUME (section 7: "a standard all-reduce ... 2 Psi data movement"; ZeRO-3: 3 Psi):
the elements a rank moves, with the (N-1)/N factor of ring algorithms dropped. To put both in the
paper's unit, each collective's payload is weighted:

    all_reduce 2 (a reduce-scatter plus an all-gather)   reduce_scatter, all_gather, broadcast, reduce 1
    send_recv  N / (2 (N-1))   (counted twice, and a ring of N-1 messages already carries the (N-1)/N)

On gloo, torch emulates reduce_scatter inside the backend as an all-reduce plus a copy, which the ledger
(it sees the Python call) counts as reduce_scatter: the real traffic of that part is about twice as much.
What a rank really sends is estimated separately (zero_train.comm.ledger.wire_from_payload, gloo-aware).
"""

from __future__ import annotations

from zero_train.comm.ledger import paper_volume_bytes, wire_from_payload

PAPER_UNIT_WEIGHTS = {
    "all_reduce": 2.0,
    "reduce_scatter": 1.0,
    "all_gather": 1.0,
    "broadcast": 1.0,
    "reduce": 1.0,
}
COLLECTIVE_KEYS = (*PAPER_UNIT_WEIGHTS, "send_recv")


def element_bytes(precision: str) -> int:
    """Bytes of one communicated element in the paper's accounting: the model's dtype."""
    return 4 if precision == "fp32" else 2


def paper_unit_bytes(payload: dict[str, int], world_size: int) -> dict[str, float]:
    """Each collective's payload in the paper's volume unit (see the module docstring).

    Args:
        payload: bytes per collective, as the run record's comm_bytes_per_step.
        world_size: ranks in the group.

    Returns:
        collective -> bytes in the paper's unit (only collectives the step used).
    """
    weights = dict(PAPER_UNIT_WEIGHTS)
    weights["send_recv"] = world_size / (2 * (world_size - 1)) if world_size > 1 else 0.0
    return {key: payload.get(key, 0) * weights[key] for key in COLLECTIVE_KEYS if payload.get(key, 0)}


def comm_comparison(record: dict, payload: dict | None) -> dict:
    """The step's communication against the paper's 2 Psi (DDP, ZeRO-1, ZeRO-2) or 3 Psi (ZeRO-3).

    Args:
        record: the run record (num_params, zero_stage, precision, world_size).
        payload: the reported rank's comm_bytes_per_step (None when it was not measured).

    Returns:
        payload (bytes per collective), volume (paper unit, per collective), measured_volume (their sum),
        paper_volume (bytes), ratio (measured_volume / paper_volume), psi_bytes (Psi x element bytes),
        gloo_emulated_reduce_scatter (bool), sent_bytes (what the rank really sends, estimated from the
        payload by zero_train.comm.ledger.wire_from_payload, gloo's emulation included) and paper_sent_bytes
        (what an ideal ring sends for the paper's volume: (N-1)/N of it).
    """
    psi_bytes = record["num_params"] * element_bytes(record["precision"])
    paper = paper_volume_bytes(record["zero_stage"], record["num_params"], element_bytes(record["precision"]))
    if payload is None:
        return dict(
            payload=None,
            volume=None,
            measured_volume=None,
            paper_volume=paper,
            ratio=None,
            psi_bytes=psi_bytes,
            gloo_emulated_reduce_scatter=False,
            sent_bytes=None,
            paper_sent_bytes=None,
        )
    used = {key: value for key, value in payload.items() if key in COLLECTIVE_KEYS and value}
    volume = paper_unit_bytes(used, record["world_size"])
    measured = sum(volume.values())
    world_size = record["world_size"]
    backend = "gloo" if record.get("device") == "cpu" else None
    return dict(
        payload=used,
        volume=volume,
        measured_volume=measured,
        paper_volume=paper,
        ratio=measured / paper if paper else None,
        psi_bytes=psi_bytes,
        gloo_emulated_reduce_scatter=backend == "gloo" and bool(used.get("reduce_scatter")),
        sent_bytes=wire_from_payload(used, world_size, backend)["total"],
        paper_sent_bytes=paper * (world_size - 1) / world_size,
    )
