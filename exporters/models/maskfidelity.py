"""What masking a population model to a density costs, and what BatchNorm RESET gives back.

Pruning a trained network to 10% of its weights without retraining it can leave it at
chance, and its BatchNorm running statistics no longer match the activations of the pruned
network (seed 003: RESET re-estimates them). `edgetrain export --density D` therefore
reports, on the windows of the users the population model never saw (its held-out users),
the accuracy of the dense model, of the masked model as exported, and of the masked model
after RESET (its running statistics re-estimated from population windows, forward passes
only), so nobody ships a pruned model without knowing. Host side (torch).
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from exporters.models.hostfinetune import Inputs, evaluate
from exporters.plans.sparse import sparsify

RESET_WINDOWS = 256  # population windows whose batch statistics RESET averages
RESET_BATCH = 32


def reset_running_statistics(model: torch.nn.Module, X: torch.Tensor) -> torch.nn.Module:
    """RESET: every BatchNorm's running statistics set to the average of its batch statistics
    over X (items [N, items, ...]), by forward passes in training mode only."""
    model = copy.deepcopy(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
    model.train()
    items = X.reshape(-1, *X.shape[2:])
    with torch.no_grad():
        for i in range(0, len(items), RESET_BATCH):
            model(items[i:i + RESET_BATCH])
    return model.eval()


def masking_fidelity(model: torch.nn.Module, spec, mean, scale, test: tuple, population: tuple,
                     users, mask_options: dict) -> dict:
    """Accuracy on `test` (x, y: the held-out users' windows) of the dense model, the model
    masked as the export masks it, and the masked model after RESET on population windows."""
    inputs = Inputs(spec, mean, scale)
    X, y = inputs(test[0]), torch.from_numpy(np.asarray(test[1]))
    pick = np.random.default_rng(0).choice(len(population[1]),
                                           min(RESET_WINDOWS, len(population[1])), False)
    masked, _ = sparsify(model, mask_options["density"],
                         mask_options.get("mask_allocation", "erk"),
                         mask_options.get("mask_init", "magnitude"))
    reset = reset_running_statistics(masked, inputs(population[0][pick]))

    def accuracy(m: torch.nn.Module) -> float:
        return round(evaluate(m, X, y)[1] / max(1, len(y)), 4)

    return {"users": [int(u) for u in users], "windows": int(len(y)),
            "density": mask_options["density"], "accuracy_dense": accuracy(model),
            "accuracy_masked": accuracy(masked), "accuracy_masked_reset": accuracy(reset),
            "reset_windows": int(len(pick))}
