"""Two small graphs beside the training graph, for work the training step cannot do itself.

* The mask-gradient graph (role `mask_grad_model`): the training graph cut down to what
  computes the gradient of each masked layer's *dense* weight. RigL grows a mask where that
  gradient is largest, but the training step only returns the gradient of the kept values
  (a GatherElements of the dense one). Outputs are named `<weight>_grad` (PyTorch name of the
  masked weight, flattened to [numel]); the runtime runs it every N steps, not every step.
* The BatchNorm statistics graph (role `batchnorm_stats_model`): the forward pass with every
  BatchNorm normalising by its batch's statistics, returning them. For RESET (seed 003) the
  runtime averages them over a few batches of user data and writes them into the running
  statistics. Outputs are named after the tensors they estimate: `<bn>.running_mean` is the
  batch mean, `<bn>.running_var` the unbiased batch variance (as torch's training mode).

Both take the artifact's parameters as graph inputs under their PyTorch names (no weights are
stored twice); the runtime feeds them from its checkpoint state.
"""
from __future__ import annotations

import copy
import io
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from edgetrain import names
from edgetrain.manifest import MaskSpec
from exporters.norms import BatchStatsNorm, batchnorm_layers
from exporters.graph import ancestors


def write_mask_grad_model(training_path: Path, masks: tuple[MaskSpec, ...], out: Path) -> None:
    """Cut the training graph at `training_path` down to the dense gradients of `masks`."""
    model = onnx.load(str(training_path))
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
    result = onnx.helper.make_model(new, opset_imports=model.opset_import,
                                    ir_version=model.ir_version)
    onnx.save(result, str(out))


class _WithStats(nn.Module):
    def __init__(self, model: nn.Module, record: list):
        super().__init__()
        self.model, self.record = model, record

    def forward(self, x: torch.Tensor):
        self.record.clear()
        logits = self.model(x)
        return (logits, *[t for _, mean, var in self.record for t in (mean, var)])


def write_batchnorm_stats_model(model: nn.Module, example_input: torch.Tensor, out: Path,
                                state_names: set[str], input_name: str) -> list[str]:
    """Export the batch-statistics forward of `model` to `out`. Returns the BatchNorm layers.

    `model` is the module exactly as exported (masked layers, frozen BatchNorm and all);
    initializers named in `state_names` become graph inputs the runtime feeds."""
    layers = batchnorm_layers(model)
    if not layers:
        return []
    model = copy.deepcopy(model).eval()
    record: list = []
    for name in layers:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, BatchStatsNorm(getattr(parent, child), name, record))
    outputs = [names.LOGITS_NAME] + [t for n in layers for t in names.running_stat_names(n)]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_WithStats(model, record), (example_input,), buf,
                          input_names=[input_name], output_names=outputs,
                          dynamic_axes={input_name: {0: names.BATCH_AXIS},
                                        names.LOGITS_NAME: {0: names.BATCH_AXIS}},
                          opset_version=17, do_constant_folding=False, dynamo=False)
    m = onnx.load_from_string(buf.getvalue())
    _initializers_to_inputs(m, state_names)
    onnx.save(m, str(out))
    return layers


def _initializers_to_inputs(m: onnx.ModelProto, state_names: set[str]) -> None:
    """The artifact's own tensors are fed at run time, not stored in this graph. The export
    wraps the model, so its tensors carry a `model.` prefix that is removed here."""
    g = m.graph
    rename = {}
    for init in list(g.initializer):
        plain = init.name.removeprefix("model.")
        if plain not in state_names:
            continue
        rename[init.name] = plain
        g.input.append(onnx.helper.make_tensor_value_info(plain, init.data_type, list(init.dims)))
        g.initializer.remove(init)
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
