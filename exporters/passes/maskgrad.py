"""Pass `mask_grad_model` (a side graph, role `mask_grad_model`): the training graph cut down
to what computes the gradient of each trained masked layer's *dense* weight.

RigL grows a mask where that gradient is largest, but the training step only returns the
gradient of the kept values (a GatherElements of the dense one). Outputs are named
`<weight>_grad` (PyTorch name of the masked weight, flattened to [numel]); the runtime runs it
every N steps, not every step (edgetrain/sidegraphs.py). It takes the artifact's parameters
as graph inputs under their PyTorch names (no weights are stored twice).
"""
from __future__ import annotations

import onnx

from edgetrain import names
from edgetrain.manifest import MaskSpec
from exporters.graph import ancestors
from exporters.passes.pipeline import Context, Graphs, Pass


def mask_grad_model(model: onnx.ModelProto, masks: tuple[MaskSpec, ...]) -> onnx.ModelProto:
    """The training graph `model` cut down to the dense gradients of `masks` (a new model;
    `model` is not changed)."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    outputs = []
    for mask in masks:
        grad_of_values = producer.get(names.grad_name(mask.values))
        if grad_of_values is None or grad_of_values.op_type != "GatherElements":
            raise ValueError(f"the training graph computes no gradient of {mask.values!r} by "
                             "GatherElements; the sparse layer was exported differently")
        dense = grad_of_values.input[0]  # [numel]: gradient of the flattened dense weight
        outputs.append(onnx.helper.make_node("Identity", [dense], [names.grad_name(mask.weight)],
                                             name=f"{mask.weight}/dense_grad"))
    keep = ancestors([o.input[0] for o in outputs], list(g.node))
    needed = {i for n in keep for i in n.input if i} | {o.input[0] for o in outputs}
    inits = [i for i in g.initializer if i.name in needed]
    inputs = [i for i in g.input if i.name in needed]
    value_info = [v for v in g.value_info if v.name in needed]
    graph_outputs = [onnx.helper.make_tensor_value_info(names.grad_name(m.weight),
                                                        onnx.TensorProto.FLOAT,
                                                        [m.numel]) for m in masks]
    new = onnx.helper.make_graph(keep + outputs, "mask_grad", inputs, graph_outputs, inits,
                                 value_info=value_info)
    return onnx.helper.make_model(new, opset_imports=model.opset_import,
                                  ir_version=model.ir_version)


def add_mask_grad_model(graphs: Graphs, ctx: Context) -> int:
    """Cut the mask-gradient side graph from the training graph; returns how many masked
    weights it gives gradients of."""
    graphs.side[names.MASK_GRAD_MODEL] = mask_grad_model(graphs.training, ctx.masks)
    return len(ctx.masks)


PASS = Pass("mask_grad_model", "side", add_mask_grad_model,
            option="density below 1, a masked layer trained", when=lambda ctx: bool(ctx.masks))
