"""Communication, measured: ``ledger.CommLedger`` counts the bytes each collective moves per step (patching
torch's ProcessGroup calls and DDP's comm hook) and turns payloads into bytes on the wire."""
