"""The PyTorch peer of one stack configuration: the same step in plain PyTorch eager.

    .venv/bin/python bench/torch_peer.py '{"network": "resnet50", "width": 1.0,
        "density": 1.0, "recompute": "none", "micro_batch": 16, "accumulation": 1,
        "patch": false, "steps": 3}'

Runs in a fresh process (bench/stack.py starts one per configuration) and prints JSON: the
process's peak resident set (VmHWM, the kernel's high-water mark, everything torch holds
plus the interpreter) and the median time of one optimizer step of `accumulation`
micro-batches on random data. Weights are random: memory and time do not depend on them.

How each technique is written in plain PyTorch, as a user of it would:
  * sparse masks: torch.nn.utils.prune.custom_from_mask with the exporter's ERK masks. The
    weight stays dense (weight_orig, its gradient and AdamW moments) plus a mask and the
    masked copy; PyTorch has no trainable sparse convolution to hold only the kept values.
  * gradient checkpointing: torch.utils.checkpoint.checkpoint_sequential over the network's
    blocks in round(sqrt(blocks)) segments (Chen et al.'s sqrt(n) plan).
  * micro-batching: gradient accumulation over `accumulation` backward passes.
  * BatchNorm frozen (eval mode, affine still trained), as the device trains it.
  * an update plan ("trainable": the artifact's trained tensor names): every other parameter
    has requires_grad False and no optimizer state, as a PyTorch user freezes layers.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time

import torch
import torch.nn.utils.prune
import torch.utils.checkpoint
from torch import nn


def rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


class Head(nn.Module):
    """Global average pool then the classifier."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x.mean(dim=(2, 3)))


class TimeHead(nn.Module):
    """Global average pool over time then the classifier (the 1-D CNN's head)."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x.mean(dim=2))


def blocks(model: nn.Module, network: str) -> nn.Sequential:
    """The network as a flat sequence of blocks (what checkpoint_sequential segments)."""
    if network == "imu_cnn":
        return nn.Sequential(*model.features, TimeHead(model.classifier))
    if network == "resnet50":
        return nn.Sequential(model.stem, model.pool, *[b for s in model.stages for b in s],
                             Head(model.classifier))
    return nn.Sequential(model.stem, *model.blocks, Head(model.classifier))


def build(spec: dict) -> nn.Sequential:
    from exporters.models.dst import TorchMasks
    from exporters.models.networks import build_network

    model, _ = build_network(spec["network"], 7, spec["width"])
    if spec["density"] < 1:
        masks = TorchMasks(model, spec["density"], "erk")
        for name, (module, attr) in masks.owners.items():
            nn.utils.prune.custom_from_mask(module, attr,
                                            masks.masks[name].view_as(masks.layers[name]))
    if spec.get("trainable"):  # a masked weight trains as weight_orig behind its mask
        trained = {n.removesuffix("_values") for n in spec["trainable"]}
        for n, p in model.named_parameters():
            p.requires_grad_(n.removesuffix("_orig") in trained)
    seq = blocks(model, spec["network"])
    seq.train()
    for m in seq.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.eval()
    return seq


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec.get("threads", 2))
    torch.manual_seed(0)
    model = build(spec)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4,
                            weight_decay=1e-4)
    size = 32 if spec["patch"] else 224
    b, k = spec["micro_batch"], spec["accumulation"]
    x = torch.randn(b, 6, 200) if spec["network"] == "imu_cnn" else torch.randn(b, 3, size, size)
    y = torch.randint(0, 7, (b,))
    segments = max(1, round(math.sqrt(len(model))))
    rss_before = rss_bytes("VmRSS")

    def forward(xb: torch.Tensor) -> torch.Tensor:
        if spec["recompute"] == "sqrt":
            return torch.utils.checkpoint.checkpoint_sequential(model, segments, xb,
                                                                use_reentrant=False)
        return model(xb)

    times = []
    for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for _ in range(k):
            loss = nn.functional.cross_entropy(forward(x), y) / k
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    note = ("dense weights behind torch.nn.utils.prune masks (no sparse trainable conv in "
            "PyTorch)" if spec["density"] < 1 else "")
    print(json.dumps({"peak_rss_bytes": rss_bytes("VmHWM"), "rss_before_step_bytes": rss_before,
                      "step_time_s": statistics.median(times), "step_times_s": times,
                      "segments": segments if spec["recompute"] == "sqrt" else None,
                      "torch": torch.__version__, "note": note}))


if __name__ == "__main__":
    main()
