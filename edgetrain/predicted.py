"""The manifest's static memory prediction, evaluated at any micro-batch (a prediction)."""
from __future__ import annotations

from edgetrain.manifest import Manifest


def predicted_for_batch(m: Manifest, batch: int) -> dict:
    """Predicted breakdown at `batch`: fixed parts plus activations scaling with the batch."""
    p = m.predicted
    breakdown = dict(p["fixed_breakdown"])
    breakdown["activations"] = p["activation_bytes_per_sample"] * batch
    return {"batch": batch, "peak_bytes": sum(breakdown.values()), "breakdown": breakdown,
            "method": p["method"]}
