"""One activations figure for every picture: `measure`'s, split into parts that sum to it.

`edgetrain measure` reports the activations the allocator saw. The pictures explain them
from the prediction's own plan of the step (its memory pattern and run-time allocations,
exporters/predictor), so each picture shows the same parts, and they add up to the measured
figure:

  * per block of the network, the pattern buffers live at the step's fullest moment, by the
    block of the node that wrote each (forward outputs backward still needs; backward
    temporaries, e.g. a gradient being summed);
  * the pattern's space never live all at once (ORT places every buffer of the step once);
  * the arena space of the run-time allocations outside the pattern;
  * what the allocator measured beyond the prediction (negative: the prediction's excess),
    labelled as the difference it is.

Without a measurement the parts sum to the predicted activations, and say so.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgetrain import names
from edgetrain.budget import arena_rounded
from exporters.predictor import claimed_plan
from exporters.predictor.ortgraph import optimized_graph
from exporters.predictor.plan import StepPlan

NEVER_LIVE = "pattern space never live at once"
RUNTIME = "run-time allocations (outside the pattern)"
BEYOND = "measured beyond the prediction"


@dataclass(frozen=True)
class ActivationParts:
    blocks: dict  # block -> {"forward": bytes, "backward": bytes} at the fullest moment
    never_live_bytes: int
    runtime_bytes: int
    predicted_bytes: int  # the sum of the parts above: the prediction's activations
    measured_bytes: int | None  # the allocator's (`measure`), when there is one
    plan: StepPlan  # the prediction's plan the parts come from (the timeline draws it)

    @property
    def total_bytes(self) -> int:
        """The figure every picture shows: the measured activations, else the predicted."""
        return self.predicted_bytes if self.measured_bytes is None else self.measured_bytes

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) in order, summing to total_bytes: the blocks, then the rest."""
        rows = [(b, v["forward"] + v["backward"]) for b, v in self.blocks.items()]
        rows += [(NEVER_LIVE, self.never_live_bytes), (RUNTIME, self.runtime_bytes)]
        if self.measured_bytes is not None:
            rows.append((BEYOND, self.measured_bytes - self.predicted_bytes))
        return rows

    def sentence(self) -> str:
        """The reconciliation in words, for a caption."""
        mib = 2 ** 20
        live = sum(v["forward"] + v["backward"] for v in self.blocks.values())
        text = (f"activations {self.total_bytes / mib:.2f} MiB"
                f" ({'measured' if self.measured_bytes is not None else 'predicted'}) = "
                f"{live / mib:.2f} live at the fullest moment + {self.never_live_bytes / mib:.2f}"
                f" pattern space never live at once + {self.runtime_bytes / mib:.2f} run-time "
                "allocations")
        if self.measured_bytes is not None:
            beyond = (self.measured_bytes - self.predicted_bytes) / mib
            text += f" + {beyond:+.2f} beyond the prediction"
        return text


def activation_parts(training_model: str, block_of_node, outputs: set[str], eval_model: str,
                     batch: int, threads: int, measured_bytes: int | None = None
                     ) -> ActivationParts:
    """The parts of the step's activations at `batch`. block_of_node(name) -> block name;
    outputs: the forward nodes' outputs (the rest of the live buffers are backward's)."""
    plan, acts = claimed_plan(training_model, eval_model, batch, threads)
    graph = optimized_graph(training_model)
    producer = {o: n.name for n in graph.graph.node for o in n.output if o}
    blocks: dict[str, dict[str, int]] = {}
    for tensor, size in plan.peak_buffers:
        name = producer.get(tensor, "").removeprefix("AccumulateGrad_")
        part = blocks.setdefault(block_of_node(name), {"forward": 0, "backward": 0})
        part["forward" if tensor in outputs else "backward"] += size
    pattern = arena_rounded(plan.pattern_bytes)
    return ActivationParts(blocks, pattern - plan.live_peak_bytes, acts - pattern, acts,
                           measured_bytes, plan)


@dataclass(frozen=True)
class MasksAtPeak:
    """The ReLU masks (exporters/passes/relugrad.py: 1 byte an element, saved in forward in
    place of the float output) among the buffers live at the step's fullest moment."""
    tensors: int
    bytes: int


def masks_at_peak(training_model: str, eval_model: str, batch: int, threads: int
                  ) -> MasksAtPeak:
    """The masks live at the fullest moment of the plan the prediction claims (predicted)."""
    plan, _ = claimed_plan(training_model, eval_model, batch, threads)
    masks = {n.output[0] for n in optimized_graph(training_model).graph.node
             if n.op_type == "Greater" and n.name.endswith(names.RELU_MASK_SUFFIX + "/greater")}
    # a mask's PassThrough copy (`<mask>_kept`) aliases the mask's buffer
    sizes = [size for tensor, size in plan.peak_buffers
             if tensor in masks or tensor.removesuffix("_kept") in masks]
    return MasksAtPeak(len(sizes), sum(sizes))
