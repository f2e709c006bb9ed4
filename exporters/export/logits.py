"""What a model must return to be trained: one tensor of class logits, [batch, classes].

Checked on the exported forward graph before ORT builds anything, so that a model returning a
tuple, a sequence of logits or another number of classes than `classes` names is refused with
what it returned and what to change, instead of failing inside ORT's loss (or, with more
outputs than classes, training labels that never occur)."""
from __future__ import annotations

import onnx


class LogitsError(ValueError):
    """The model's output is not [batch, classes] logits."""


def check_logits(model: onnx.ModelProto, classes: int) -> None:
    if classes < 2:
        raise LogitsError(f"{classes} class names given; a classifier needs at least two "
                          "(classes=[...], one name per logit). Nothing was written.")
    outputs = model.graph.output
    if len(outputs) != 1:
        raise LogitsError(
            f"the model returns {len(outputs)} tensors; edgetrain trains a model that returns "
            "one tensor of class logits [batch, classes]. Wrap it so that forward returns the "
            "logits alone. Nothing was written.")
    dims = outputs[0].type.tensor_type.shape.dim
    shape = ["batch" if d.dim_param else d.dim_value for d in dims]
    what = (f"the model returns a tensor of shape {shape}; edgetrain trains class logits of "
            f"shape [batch, {classes}] (one per class name given)")
    if len(dims) != 2:
        raise LogitsError(f"{what}. Reduce its output to one row of {classes} logits per "
                          "sample (e.g. a mean over time, then a Linear). Nothing was written.")
    if dims[1].dim_value and dims[1].dim_value != classes:
        raise LogitsError(f"{what}. Make its last layer output {classes} values per sample, or "
                          f"pass {shape[1]} class names. Nothing was written.")
