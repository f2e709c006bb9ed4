"""Pass `batchnorm_stats_model` (a side graph, role `batchnorm_stats_model`): the forward pass
with every BatchNorm normalising by its batch's statistics, returning them.

For RESET (seed 003) the runtime averages them over a few batches of user data and writes them
into the running statistics. Outputs are named after the tensors they estimate:
`<bn>.running_mean` is the batch mean, `<bn>.running_var` the unbiased batch variance (as
torch's training mode). It is exported from the torch module exactly as exported (masked
layers, frozen BatchNorm and all), and takes the artifact's parameters as graph inputs under
their PyTorch names (no weights are stored twice).
"""
from __future__ import annotations

import copy
import io
import warnings

import onnx
import torch
from torch import nn

from edgetrain import names
from exporters.models.norms import BatchStatsNorm, batchnorm_layers
from exporters.passes.pipeline import Context, Graphs, Pass


class _WithStats(nn.Module):
    def __init__(self, model: nn.Module, record: list):
        super().__init__()
        self.model, self.record = model, record

    def forward(self, x: torch.Tensor):
        self.record.clear()
        logits = self.model(x)
        return (logits, *[t for _, mean, var in self.record for t in (mean, var)])


def batchnorm_stats_model(model: nn.Module, example_input: torch.Tensor, state_names: set[str],
                          input_name: str) -> onnx.ModelProto | None:
    """The batch-statistics forward of `model`, None when it has no BatchNorm layer.

    `model` is the module exactly as exported (masked layers, frozen BatchNorm and all);
    initializers named in `state_names` become graph inputs the runtime feeds."""
    layers = batchnorm_layers(model)
    if not layers:
        return None
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
    return m


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


def add_batchnorm_stats_model(graphs: Graphs, ctx: Context) -> int:
    """Export the BatchNorm statistics side graph from the torch module; returns how many
    BatchNorm layers it estimates (none: no side graph)."""
    from edgetrain.names import INPUT_NAME

    m = batchnorm_stats_model(ctx.torch_model, ctx.example_input, set(ctx.state_names),
                              INPUT_NAME)
    if m is None:
        return 0
    graphs.side[names.BATCHNORM_STATS_MODEL] = m
    return len(batchnorm_layers(ctx.torch_model))


PASS = Pass("batchnorm_stats_model", "side", add_batchnorm_stats_model,
            option="not int8_frozen", when=lambda ctx: not ctx.int8)
