"""The runtime's memory budget: a hard cap on the bytes ONNX Runtime may allocate for
training, split from one budget, and ORT's out-of-memory errors translated into BudgetError.
A real watch needs this as much as the simulator does: it belongs to the runtime.

Where ORT 1.19.2's training API puts its bytes (measured, see docs/concepts.md):
  * checkpoint tensors (trainable and frozen parameters): one private BFC arena per tensor,
    created when the checkpoint loads, outside any arena we can configure; each tensor takes
    exactly one chunk of its size rounded up to 256 bytes. Their size is fixed and known from
    the manifest before anything loads.
  * gradients, optimizer moments, every activation and temporary of the training, eval and
    optimizer graphs: the environment's shared arena, which we cap with `max_mem`.
  * three scalars the API creates per run (lazy_reset_grad flag, learning rate, step):
    one 256-byte chunk each, outside the arena.
  * the training Module's graph constants (training, eval and optimizer graphs): one buffer
    per session taken with BFCArena::Reserve when the Module opens, before anything else is
    allocated. Reserve does not check the arena's limit but counts toward it, so every later
    request is checked against what is left. A reservation that pushed the arena past its
    limit would turn ORT's check `limit - allocated` (unsigned) into a huge number and lift
    the cap for the rest of the process, so the cap must at least hold these bytes
    (min_cap_bytes, an upper estimate from the graphs' stored tensors).
  * every session the runtime opens later (side graphs, the inference model it opens to
    check that it predicts what training predicts) runs without a memory pattern and
    without weight prepacking (edgetrain/sessions.py): its weights and constants are then
    ordinary arena allocations, inside the limit. (With a memory pattern its initializers
    are one Reserve past the limit; with prepacking, MLAS's padded copies of MatMul/Gemm
    weights are, measured.)
So the budget is split exactly: state and scalar bytes are taken up front, and the rest
becomes the arena's hard limit. A budget below the fixed part fails before anything loads;
an arena request past its limit fails inside ORT before the allocation happens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ARENA_CHUNK_BYTES = 256  # BFCArena's kMinAllocationSize: every chunk is a multiple of this
RUNTIME_SCALAR_CHUNKS = 3  # lazy_reset_grad (bool), learning_rate (float), step (int64)
RUNTIME_SCALAR_BYTES = RUNTIME_SCALAR_CHUNKS * ARENA_CHUNK_BYTES
MAX_BUDGET_BYTES = 1 << 48  # 256 TiB: more than any device has; ORT's limit is a size_t


def arena_rounded(nbytes: int) -> int:
    """Bytes a BFC arena chunk takes for a request of `nbytes` (at least one 256-byte chunk)."""
    return max(ARENA_CHUNK_BYTES, -(-nbytes // ARENA_CHUNK_BYTES) * ARENA_CHUNK_BYTES)


class BudgetError(RuntimeError):
    """The training working set does not fit the device's RAM budget. micro_batch and
    threads: the step that failed (None when no step ran); predicted: the message already
    says the step's predicted need."""

    def __init__(self, message: str, budget_bytes: int, needed_bytes: int | None,
                 micro_batch: int | None = None, threads: int | None = None,
                 predicted: bool = False):
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.needed_bytes = needed_bytes
        self.micro_batch = micro_batch
        self.threads = threads
        self.predicted = predicted


BATCH_FIX = "a smaller --micro-batch (gradients accumulate to the same effective batch)"


def fixes(manifest=None, micro_batch: int | None = None) -> str:
    """What can make training fit, only what applies: a smaller micro-batch when a step ran
    above 1; what the artifact's export did not use yet (an update plan, a recompute plan,
    sparsity, a narrower width for a built-in network); a device with more RAM."""
    items = [BATCH_FIX] if micro_batch is not None and micro_batch > 1 else []
    plan = getattr(manifest, "plan", None)
    export = [] if plan is not None and plan.update != "all" else ["--update head"]
    export += [] if plan is not None and plan.recompute != "none" else ["--recompute sqrt"]
    export += [] if getattr(manifest, "masks", ()) else ["--density 0.5"]
    config = (getattr(manifest, "provenance", None) or {}).get("config") or {}
    if "width" in config:  # a built-in network: its width multiplier can shrink
        width = config["width"]
        export.append(f"--width below {width:g}" if isinstance(width, (int, float))
                      else "--width below the network's default")
    if export and manifest is not None and "width" not in config and not config:
        # exported from Python (no built-in network's pretraining config): its arguments
        python = {"--update head": 'update="head"', "--recompute sqrt": 'recompute="sqrt"',
                  "--density 0.5": "density=0.5"}
        items.append("re-exporting with less to train or keep (export_artifact("
                     f"{', '.join(python[e] for e in export if e in python)}))")
    elif export:
        items.append(f"re-exporting with less to train or keep ({', '.join(export)})")
    return ", ".join(items + ["or a device profile with more RAM"])


@dataclass(frozen=True)
class BudgetSplit:
    budget_bytes: int
    state_bytes: int  # checkpoint tensors, each rounded to its arena chunk
    scalar_bytes: int  # the API's per-run scalars
    arena_cap_bytes: int  # hard limit handed to the env arena

    @classmethod
    def from_budget(cls, budget_bytes: int, state_bytes: int, min_cap_bytes: int = 0,
                    advice: str | None = None) -> "BudgetSplit":
        """min_cap_bytes: the least cap that holds the training Module's reserved constants;
        advice: what to try when the parameters alone do not fit (default: fixes())."""
        if budget_bytes <= 0:
            raise BudgetError(f"budget must be a positive number of bytes, got {budget_bytes}; "
                              "pass e.g. --budget 16MB or --device NAME", budget_bytes, None)
        if budget_bytes > MAX_BUDGET_BYTES:
            raise BudgetError(f"budget of {budget_bytes} bytes is beyond any device (the most "
                              f"edgetrain takes is {MAX_BUDGET_BYTES} bytes, 256 TiB); pass the "
                              "device's RAM, e.g. --budget 16MB", budget_bytes, None)
        fixed = state_bytes + RUNTIME_SCALAR_BYTES
        if budget_bytes <= fixed + min_cap_bytes:
            raise BudgetError(
                f"budget of {budget_bytes} bytes is below the model's parameters alone "
                f"({state_bytes} bytes, plus {RUNTIME_SCALAR_BYTES} of runtime scalars and "
                f"{min_cap_bytes} for the graphs' constants); no step can run. "
                f"Try {advice or fixes()}.", budget_bytes,
                fixed + min_cap_bytes + ARENA_CHUNK_BYTES)
        return cls(budget_bytes, state_bytes, RUNTIME_SCALAR_BYTES, budget_bytes - fixed)


def state_bytes(tensors) -> int:
    """Bytes the checkpoint tensors (TensorSpecs) occupy once loaded: one arena chunk each."""
    return sum(arena_rounded(t.nbytes) for t in tensors)


def install_arena(ort, cap_bytes: int | None) -> None:
    """Register the env arena that every training session in this process allocates from.

    cap_bytes None means no limit (measurement). Must be called once, before any session.
    `arena_extend_strategy` 1 (kSameAsRequested) grows the arena by exactly what is asked,
    so its size is the true high-water mark, not a power-of-two overshoot.
    """
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                             ort.OrtMemType.DEFAULT)
    cfg = {"arena_extend_strategy": 1}
    if cap_bytes is not None:
        cfg["max_mem"] = int(cap_bytes)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(cfg))


_ARENA_FAIL = re.compile(r"Available memory of (\d+) is smaller than requested bytes of (\d+)")


def budget_error_from(exc: BaseException, split: BudgetSplit, what: str, advice: str | None = None,
                      micro_batch: int | None = None, threads: int | None = None
                      ) -> BudgetError | None:
    """Turn ORT's arena-exhausted error into a BudgetError naming the bytes; None if unrelated.
    advice: what to try (default: fixes()); micro_batch, threads: the failing step's."""
    m = _ARENA_FAIL.search(str(exc))
    if not m:
        return None
    available, requested = int(m.group(1)), int(m.group(2))
    needed = split.budget_bytes + requested - available
    return BudgetError(
        f"{what} needs more memory than the budget: it asked the runtime for {requested} bytes "
        f"with {available} left of the {split.arena_cap_bytes}-byte working-set cap "
        f"(budget {split.budget_bytes} bytes = {split.state_bytes} parameters + "
        f"{split.scalar_bytes} runtime scalars + {split.arena_cap_bytes} for gradients, "
        f"optimizer state, activations and the graphs' weights and constants). It needs at "
        f"least {needed} bytes; "
        f"`edgetrain measure` gives the exact peak. Try {advice or fixes(None, micro_batch)}. "
        "Nothing was written: saved checkpoints are untouched.",
        split.budget_bytes, needed, micro_batch, threads)


def with_prediction(err: BudgetError, predicted: dict, micro_batch: int) -> BudgetError:
    """The error, with what the step needs by a static prediction when that is for this
    micro-batch (`needs at least` alone is a lower bound: the request that failed).
    predicted: the manifest's, or a fresh one ({"batch", "peak_bytes", "complete"})."""
    if predicted.get("batch") != micro_batch or not predicted.get("complete", True):
        return err
    peak = int(predicted["peak_bytes"])
    margin = -(-peak * 101 // 100)  # the predictor's stated margin: 1% on built-in networks
    if err.needed_bytes is not None and margin < err.needed_bytes:
        said = (f"The static prediction for micro-batch {micro_batch}, {peak} bytes, is below "
                "that: it misses some of this step's bytes, so `edgetrain measure` (uncapped) "
                "is the way to learn the whole need.")
    else:
        said = (f"At micro-batch {micro_batch} the whole step needs about {peak} bytes (a "
                "static prediction: within 1% of the allocator on the built-in networks, so "
                f"a budget of {margin} bytes holds it there; `edgetrain "
                "measure` replays the run exactly).")
    text = str(err)
    text = text.replace(" Try ", f" {said} Try ", 1) if " Try " in text else f"{text} {said}"
    return BudgetError(text, err.budget_bytes, max(peak, err.needed_bytes or 0),
                       err.micro_batch, err.threads, predicted=True)
