"""Activations saved for backward in 8 bits (export --saved-activations int8,
exporters/passes/int8saved.py): the gradients are torch's for the same network with its saved
tensors rounded as ONNX's DynamicQuantizeLinear rounds them, and no float copy of a rounded
tensor is read in backward."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest import device_gradients

CLASSES = ["a", "b", "c"]
SHAPE = (2, 24)


def rounded(x):
    """DynamicQuantizeLinear then DequantizeLinear (ONNX: uint8 over [min(0, x), max(0, x)],
    round half to even), in float32 as ORT computes it."""
    import torch

    lo = torch.clamp(x.min(), max=0.0)
    hi = torch.clamp(x.max(), min=0.0)
    scale = (hi - lo) / 255.0
    zero = torch.clamp(torch.round(-lo / scale), 0, 255)
    q = torch.clamp(torch.round(x / scale) + zero, 0, 255)
    return (q - zero) * scale


def model_pair(seed: int = 0):
    """A 1-D CNN (three conv + ReLU layers, the third reading the sum of the first two's
    outputs; mean, linear) and its torch twin whose backward reads each saved activation
    rounded."""
    import torch
    from torch import nn
    from torch.nn.grad import conv1d_input, conv1d_weight

    class SavedConv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, quantise):
            ctx.save_for_backward(rounded(x) if quantise else x, w)
            ctx.x_shape = x.shape
            return nn.functional.conv1d(x, w, b, padding=1)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            return (conv1d_input(ctx.x_shape, w, dy, padding=1),
                    conv1d_weight(x, w.shape, dy, padding=1), dy.sum(dim=(0, 2)), None)

    class SavedRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.relu(x)
            ctx.save_for_backward(rounded(y))
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return dy * (y > 0)

    torch.manual_seed(seed)

    class Net(nn.Module):
        def __init__(self, twin: bool = False):
            super().__init__()
            self.c1, self.c2, self.c3 = (nn.Conv1d(2, 8, 3, padding=1),
                                         nn.Conv1d(8, 8, 3, padding=1),
                                         nn.Conv1d(8, 8, 3, padding=1))
            self.head = nn.Linear(8, len(CLASSES))
            self.twin = twin

        def forward(self, x):
            if not self.twin:
                h = torch.relu(self.c1(x))
                h2 = torch.relu(self.c2(h))
                h3 = torch.relu(self.c3(h2 + h))
                return self.head(h3.mean(dim=2))
            h = SavedRelu.apply(SavedConv.apply(x, self.c1.weight, self.c1.bias, False))
            h2 = SavedRelu.apply(SavedConv.apply(h, self.c2.weight, self.c2.bias, True))
            h3 = SavedRelu.apply(SavedConv.apply(h2 + h, self.c3.weight, self.c3.bias, True))
            return self.head(h3.mean(dim=2))

    net = Net()
    twin = Net(twin=True)
    twin.load_state_dict(net.state_dict())
    return net, twin


def export(out, saved: str = "int8"):
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    net, twin = model_pair()
    m = export_artifact(net, torch.zeros(2, *SHAPE), out, classes=CLASSES,
                        plan=Plan(micro_batch=4, saved_activations=saved), model_name="cnn3")
    return twin, m


def test_gradients_equal_torch_with_rounded_saved_tensors(tmp_path):
    import torch

    twin, m = export(tmp_path / "art")
    assert m.plan.saved_activations == "int8"
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (4, *SHAPE)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int64)
    loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    got = device_gradients(tmp_path / "art", x, y)
    assert abs(got["loss"] - loss.item()) < 1e-5
    for name, p in twin.named_parameters():
        np.testing.assert_allclose(got["grads"][name], p.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_no_float_copy_of_a_rounded_tensor_reaches_backward(tmp_path):
    """Each rounded activation: read in backward only through its uint8 copy (1 byte an
    element: the saved bytes are numel x 1 plus a scale and a zero point), the float tensor
    read by forward nodes alone."""
    from edgetrain import names
    from exporters.graph import is_backward, stated_shapes

    export(tmp_path / "art")
    g = onnx.load(str(tmp_path / "art" / "training_model.onnx"), load_external_data=False)
    shapes = stated_shapes(g)
    types = {v.name: v.type.tensor_type.elem_type for v in g.graph.value_info}
    quantised = [n.input[0].removesuffix(names.SAVED_INT8_SUFFIX + "_ready") for n in g.graph.node
                 if n.op_type == "DynamicQuantizeLinear"]
    # the first ReLU's output (conv 2's input, its own mask), the second's (its mask), their
    # sum (conv 3's input) and the last ReLU's output (its mask)
    assert len(quantised) == 4
    for t in quantised:
        q = names.saved_int8_names(t)[0]
        assert types[q] == onnx.TensorProto.UINT8 and shapes[q] == shapes[t]
        readers = [n for n in g.graph.node if t in n.input]
        assert readers and not any(is_backward(n) for n in readers), t


def test_int8_with_recompute_is_refused():
    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions

    with pytest.raises(ValueError, match="do not combine"):
        ExportOptions(plan=Plan(saved_activations="int8"), recompute="sqrt")
