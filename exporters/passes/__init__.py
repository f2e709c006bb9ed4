"""The exporter's rewrites, one module each, run in order by one pipeline (pipeline.py).

FORWARD_PASSES run on the ONNX forward graph torch exported, before ORT's artifact builder
makes the training, eval and optimizer graphs from it; ARTIFACT_PASSES run on those graphs
(and add the side graphs). The order matters where it is said: the frozen layers' input
gradients are rewritten before the ReLU gradients (a ReLU output only they read is then kept
as a 1-byte mask), and both before the saved activations are put in 8 bits (what is left
saved); the recompute plan is made
after the gradient kernels are rewritten (its copies start from them) and before the masked
pointwise gradients (the mask-gradient graph needs the dense ones); the eval fixes read the
final training graph; NCHWc comes last, so it also takes the recompute copies and the
depthwise input-gradient Convs; the pointwise weight gradients are declared after every
rewrite of a ConvGrad. `describe()` prints the table docs/concepts.md draws.
"""
from __future__ import annotations

from exporters.passes import (batchnormstats, convbn, convpads, densebuild, depthwisegrad,
                              evalfixes, frozenconvgrad, int8saved, maskgrad, nchwc,
                              pointwisegrad, recompute, recurrentgrads, relugrad,
                              scatterindices, sparsegrad, stackedgrad, weightgradshapes)
from exporters.passes.pipeline import Context, Graphs, Pass, run_passes

FORWARD_PASSES: tuple[Pass, ...] = (
    convpads.PASS,
    convbn.PASS,
    scatterindices.PASS,
)

ARTIFACT_PASSES: tuple[Pass, ...] = (
    evalfixes.BATCHNORM_OUTPUTS,
    recurrentgrads.PASS,
    depthwisegrad.PASS,
    frozenconvgrad.PASS,
    relugrad.PASS,
    int8saved.PASS,
    recompute.PASS,
    maskgrad.PASS,
    sparsegrad.PASS,
    batchnormstats.PASS,
    evalfixes.FIXES,
    densebuild.PASS,
    pointwisegrad.PASS,
    stackedgrad.PASS,
    weightgradshapes.PASS,
    nchwc.PASS,
)

__all__ = ["ARTIFACT_PASSES", "FORWARD_PASSES", "Context", "Graphs", "Pass", "describe",
           "run_passes"]


def describe() -> list[dict]:
    """Every pass in order: stage, name, graph, targets, the option that enables it, and what
    it rewrites."""
    return [{"stage": stage, "name": p.name, "graph": p.graph, "targets": list(p.targets),
             "option": p.option or "always", "rewrites": p.summary}
            for stage, passes in (("forward", FORWARD_PASSES), ("artifact", ARTIFACT_PASSES))
            for p in passes]
