"""Passes `batchnorm_stats_model` and `batchnorm_moments_model`: the side graphs that re-estimate
BatchNorm statistics on the user's data (label-free adaptation, RESET), as the plan says
(`Plan.batchnorm_adapt`, edgetrain/names.batchnorm_side_roles).

  * batch (seed 003's RESET): the forward pass with every BatchNorm normalising by its batch's
    statistics, returning them: `<bn>.running_mean` is the batch mean, `<bn>.running_var` the
    unbiased batch variance (as torch's training mode). The runtime averages them over a few
    batches; at a small micro-batch the later layers see inputs normalised by a few samples.
    A step of several micro-batches estimates over the whole step (micro-batch x accumulation,
    as the gradients do) from the moments graph below, one layer per pass, so a plan that
    micro-batches to fit gets the statistics of the batch it stands for.
  * exact: the forward pass with every BatchNorm normalising by its running statistics (eval
    mode), returning the moments of each layer's input minus its running mean
    (edgetrain/names.moment_names), with each layer's elements per channel of one sample in
    the graph's metadata. The runtime sets one layer per pass over every sample, earlier
    layers first, so each layer's statistics are those of its input over all the samples,
    whatever the micro-batch.
Both are exported from the torch module exactly as exported (masked layers, frozen BatchNorm
and all) and take the artifact's parameters as graph inputs under their PyTorch names (no
weights are stored twice). Outputs follow the order the layers run in (a dry forward says it),
which is what the exact estimate needs.
"""
from __future__ import annotations

import copy
import io
import warnings

import onnx
import torch
from torch import nn

from edgetrain import names
from exporters.models.norms import BatchStatsNorm, MomentsNorm, batchnorm_layers
from exporters.passes.pipeline import Context, Graphs, Pass


class _WithStats(nn.Module):
    def __init__(self, model: nn.Module, record: list):
        super().__init__()
        self.model, self.record = model, record

    def forward(self, x: torch.Tensor):
        self.record.clear()
        logits = self.model(x)
        return (logits, *[t for _, *tensors in self.record for t in tensors])


# role -> (the BatchNorm replacement recording its tensors, a layer's output names)
KINDS = {names.BATCHNORM_STATS_MODEL: (BatchStatsNorm, names.running_stat_names),
         names.BATCHNORM_MOMENTS_MODEL: (MomentsNorm, names.moment_names)}


def batchnorm_stats_model(model: nn.Module, example_input: torch.Tensor, state_names: set[str],
                          input_name: str, role: str = names.BATCHNORM_STATS_MODEL
                          ) -> onnx.ModelProto | None:
    """The side graph `role` (KINDS) of `model`, None when it has no BatchNorm layer.

    `model` is the module exactly as exported (masked layers, frozen BatchNorm and all);
    initializers named in `state_names` become graph inputs the runtime feeds."""
    layers = batchnorm_layers(model)
    if not layers:
        return None
    norm, outputs_of = KINDS[role]
    model = copy.deepcopy(model).eval()
    record: list = []
    for name in layers:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, norm(getattr(parent, child), name, record))
    wrapped = _WithStats(model, record)
    with torch.no_grad():
        wrapped(example_input)  # the order the layers run in, which names the outputs
    called = [name for name, *_ in record]
    shared = sorted({n for n in called if called.count(n) > 1})
    if shared:
        raise ValueError(f"BatchNorm layers {shared} run more than once in one forward pass; "
                         "their statistics would mix inputs of different places. Give each "
                         "use its own BatchNorm layer. Nothing was written.")
    outputs = [names.LOGITS_NAME] + [t for n in called for t in outputs_of(n)]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (example_input,), buf,
                          input_names=[input_name], output_names=outputs,
                          dynamic_axes={input_name: {0: names.BATCH_AXIS},
                                        names.LOGITS_NAME: {0: names.BATCH_AXIS}},
                          opset_version=17, do_constant_folding=False, dynamo=False,
                          keep_initializers_as_inputs=True)  # never merge equal tensors
    m = onnx.load_from_string(buf.getvalue())
    _initializers_to_inputs(m, state_names)
    if norm is MomentsNorm:  # each layer's elements per channel of one sample, as metadata
        counts = {names.moment_count_name(n): str(model.get_submodule(n).elements)
                  for n in called}  # (a count output cost the arena 64 KiB a pass)
        onnx.helper.set_model_props(m, counts)
    return m


def _initializers_to_inputs(m: onnx.ModelProto, state_names: set[str]) -> None:
    """The artifact's own tensors are fed at run time, not stored in this graph. The export
    wraps the model, so its tensors carry a `model.` prefix that is removed here."""
    g = m.graph
    inputs = {i.name: i for i in g.input}
    rename = {}
    for init in list(g.initializer):
        plain = init.name.removeprefix("model.")
        if plain not in state_names:
            continue
        rename[init.name] = plain
        if init.name in inputs:  # exported as an input with a default: the input stays
            inputs[init.name].name = plain
        else:
            g.input.append(onnx.helper.make_tensor_value_info(plain, init.data_type,
                                                              list(init.dims)))
        g.initializer.remove(init)
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]


def add_batchnorm_stats_model(graphs: Graphs, ctx: Context) -> int:
    """Export the BatchNorm statistics side graphs the plan's adaptation runs from the torch
    module (edgetrain/names.batchnorm_side_roles); returns how many BatchNorm layers they
    estimate (none: no side graph)."""
    for role in names.batchnorm_side_roles(ctx.plan.batchnorm_adapt):
        m = batchnorm_stats_model(ctx.torch_model, ctx.example_input, set(ctx.state_names),
                                  names.INPUT_NAME, role)
        if m is None:
            return 0
        graphs.side[role] = m
    return len(batchnorm_layers(ctx.torch_model))


PASS = Pass("batchnorm_stats_model", "side", add_batchnorm_stats_model,
            option="not int8_frozen", when=lambda ctx: not ctx.int8)
