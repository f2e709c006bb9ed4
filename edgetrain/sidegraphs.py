"""The runtime's side graphs: small inference graphs beside the training graph, run inside the
same memory cap, their parameter inputs fed from the live checkpoint state (zero-copy).

  * mask_grad_model: the gradient of each masked layer's dense weight (what RigL grows by);
  * batchnorm_stats_model: every BatchNorm's batch statistics (what RESET averages);
    RESET over a step of several micro-batches builds each batch's from the moments below;
  * batchnorm_moments_model: the moments of every BatchNorm's input, normalising by the running
    statistics (what the exact estimate sets one layer at a time).
The exporter writes them (exporters/passes/maskgrad.py, batchnormstats.py); their output names
follow edgetrain/names.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from edgetrain import names
from edgetrain.manifest import ArtifactError, Manifest
from edgetrain.watchdog import guard

Batches = Callable[[], Iterable[np.ndarray]]  # each call: a fresh iterator of inputs [B, *sample]


class SideGraphs:
    def __init__(self, ort, files: dict[str, str], manifest: Manifest, session_options: Callable,
                 parameters: Callable[[], object],
                 translate: Callable[[BaseException, str], BaseException]):
        """files: role -> path. session_options(): fresh SessionOptions for a new session.
        parameters(): the live CheckpointState's parameters. translate: turns an ORT error
        into the runtime's error (a BudgetError when out of memory)."""
        self._ort, self._files, self._manifest = ort, files, manifest
        self._so, self._parameters, self._translate = session_options, parameters, translate
        self._sessions: dict = {}

    def open(self, role: str):
        """The session of side graph `role`, opened once and kept."""
        if role not in self._sessions:
            if role not in self._files:
                raise ArtifactError(f"the artifact has no {role} (manifest files: "
                                    f"{sorted(self._files)}); re-export it with this edgetrain")
            try:
                self._sessions[role] = self._ort.InferenceSession(
                    self._files[role], self._so(), providers=["CPUExecutionProvider"])
            except Exception as e:  # ORT's InferenceSession errors are not RuntimeErrors
                raise self._translate(e, f"loading the {role}") from e
        return self._sessions[role]

    def run(self, role: str, feeds: dict, what: str) -> dict[str, np.ndarray]:
        """Run side graph `role` on feeds; returns its outputs by name."""
        sess = self.open(role)
        params = self._parameters()  # .data is a zero-copy view of the state's tensor
        feeds = {**{i.name: params[i.name].data for i in sess.get_inputs() if i.name in params},
                 **feeds}
        try:
            with guard(what):
                outs = sess.run(None, feeds)
        except Exception as e:  # ORT's InferenceSession errors are not RuntimeErrors
            raise self._translate(e, what) from e
        # copies: ORT's arrays are views of arena chunks, and one kept while the next run
        # allocates splits the free space that run would use (the grouped RESET keeps each
        # run's moments while it runs the next)
        return {o.name: np.array(v, copy=True) for o, v in zip(sess.get_outputs(), outs)}

    def dense_gradients(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]
                        ) -> dict[str, np.ndarray]:
        """Gradient of the loss w.r.t. each masked layer's dense weight, flattened [numel] and
        summed over `batches` of (x, y), by the dense weight's name. Changes no state."""
        inp = self._manifest.input
        total: dict[str, np.ndarray] = {}
        for x, y in batches:
            outs = self.run(names.MASK_GRAD_MODEL,
                            {inp.name: np.ascontiguousarray(x, np.float32),
                             inp.label_name: np.ascontiguousarray(y, np.int64)},
                            f"the dense gradients at micro-batch {len(x)}")
            for name, g in outs.items():
                total[name] = g if name not in total else total[name] + g
        return {m.weight: total[names.grad_name(m.weight)] for m in self._manifest.trained_masks}

    def batchnorm_means(self, batches: Iterable[np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """Each running statistic's mean over `batches` (inputs [B, *sample_shape]) of its batch
        estimate, by tensor name (float64), and the number of batches. Forward passes only."""
        sums: dict[str, np.ndarray] = {}
        count = 0
        for x in batches:
            outs = self.run(names.BATCHNORM_STATS_MODEL,
                            {self._manifest.input.name: np.ascontiguousarray(x, np.float32)},
                            f"BatchNorm statistics at batch {len(x)}")
            for name, v in outs.items():
                if name != names.LOGITS_NAME:
                    sums[name] = sums.get(name, 0) + v.astype(np.float64)
            count += 1
        return {name: s / max(count, 1) for name, s in sums.items()}, count

    def reset_batchnorm(self, batches: Batches, group: int = 1) -> int:
        """Re-estimate every BatchNorm's running statistics on the inputs `batches()` yields,
        by forward passes only, as the plan says (Plan.batchnorm_adapt): "batch" is RESET
        (seed 003), one pass, each batch estimate from `group` consecutive micro-batches
        (a step's accumulation: one layer per pass then); "exact" one pass per layer. Returns
        the forward passes run."""
        if self._manifest.plan.batchnorm_adapt == "exact":
            return self._reset_exact(batches)
        if group > 1:
            return self._reset_grouped(batches, group)
        means, count = self.batchnorm_means(batches())
        if count == 0:
            raise ValueError("BatchNorm RESET needs at least one batch of samples")
        for name, mean in means.items():
            self._set(name, mean)
        return count

    def probe_batchnorm(self, x: np.ndarray, group: int = 1) -> None:
        """Run the statistics graph reset_batchnorm(…, group) runs once on x (a budget
        check); changes no state."""
        self.run(self._manifest.batchnorm_pass_role(group),
                 {self._manifest.input.name: np.ascontiguousarray(x, np.float32)},
                 f"BatchNorm statistics at batch {len(x)}")

    def _moment_layers(self) -> list[str]:
        """The moments graph's BatchNorm layers in the order they run, each checked for its
        outputs and its checkpoint statistics."""
        outputs = [o.name for o in self.open(names.BATCHNORM_MOMENTS_MODEL).get_outputs()]
        layers = [layer for o in outputs if (layer := names.moments_layer(o)) is not None]
        params = self._parameters()
        for layer in layers:
            missing = [n for n in names.moment_names(layer) if n not in outputs] + [
                n for n in names.running_stat_names(layer) if n not in params]
            if missing:
                raise ArtifactError(f"the BatchNorm moments graph's layer {layer!r} lacks "
                                    f"{missing} (outputs of the graph, or statistics of the "
                                    "checkpoint); re-export the artifact")
        return layers

    def _elements(self, layers: list[str]) -> dict[str, int]:
        """Each layer's elements per channel of one sample, from the moments graph's metadata:
        a positive whole number for every layer, else an ArtifactError."""
        meta = self.open(names.BATCHNORM_MOMENTS_MODEL).get_modelmeta().custom_metadata_map
        counts = {}
        for layer in layers:
            value = meta.get(names.moment_count_name(layer), "")
            if not value.isdigit() or int(value) < 1:
                raise ArtifactError(f"the BatchNorm moments graph gives layer {layer!r} no "
                                    f"element count (metadata {names.moment_count_name(layer)!r}"
                                    f" is {value!r}); re-export the artifact with this edgetrain")
            counts[layer] = int(value)
        return counts

    def _reset_grouped(self, batches: Batches, group: int) -> int:
        """RESET whose batch is `group` consecutive micro-batches (an incomplete last group
        is left out, as RESET leaves out a partial batch): per group, each layer in the order
        it runs gets its input's batch mean and variance over the group, the layers before it
        normalising by theirs, as in one training-mode pass over the whole batch; the running
        statistics become the mean over groups of the batch mean and unbiased variance."""
        layers = self._moment_layers()
        elements = self._elements(layers)
        sums: dict[str, np.ndarray] = {}
        passes = groups = 0
        it = iter(batches())
        while len(xs := [x for _, x in zip(range(group), it)]) == group:
            for layer in layers:  # the layers after it normalise by the batch's statistics
                mean, var, n, runs = self._set_from_moments(layer, xs, elements[layer])
                mean_name, var_name = names.running_stat_names(layer)
                sums[mean_name] = sums.get(mean_name, 0.0) + mean
                sums[var_name] = sums.get(var_name, 0.0) + var * n / max(n - 1.0, 1.0)
                passes += runs
            groups += 1
        if groups == 0:
            raise ValueError(f"BatchNorm RESET over steps of {group} micro-batches needs at "
                             "least one whole step of samples")
        for name, total in sums.items():
            self._set(name, total / groups)
        return passes

    def _reset_exact(self, batches: Batches) -> int:
        """Each layer in the order it runs: its input's mean and variance over every sample,
        the layers before it already set (AdaBN's statistics, exact at any micro-batch)."""
        return sum(self._set_from_moments(layer, batches(), 1)[3]
                   for layer in self._moment_layers())

    def _set_from_moments(self, layer: str, xs, elements: int
                          ) -> tuple[np.ndarray, np.ndarray, float, int]:
        """One moments-graph pass per input of `xs`: set `layer`'s running statistics to its
        input's mean and (population) variance over them, each sample weighing `elements`
        per channel. Returns (mean, variance, elements in all, passes run)."""
        role, inp = names.BATCHNORM_MOMENTS_MODEL, self._manifest.input.name
        first, second = names.moment_names(layer)
        s1 = s2 = n = 0.0
        passes = 0
        for x in xs:
            outs = self.run(role, {inp: np.ascontiguousarray(x, np.float32)},
                            f"BatchNorm moments at batch {len(x)}")
            count = float(elements * len(x))
            s1 = s1 + outs[first].astype(np.float64) * count
            s2 = s2 + outs[second].astype(np.float64) * count
            n += count
            passes += 1
        if n == 0:
            raise ValueError("BatchNorm statistics need at least one batch of samples")
        mean_name, var_name = names.running_stat_names(layer)
        shift = s1 / n
        mean = self._parameters()[mean_name].data.astype(np.float64) + shift
        var = np.maximum(s2 / n - shift * shift, 0.0)
        self._set(mean_name, mean)
        self._set(var_name, var)
        return mean, var, n, passes

    def _set(self, name: str, value: np.ndarray) -> None:
        params = self._parameters()
        if name not in params:
            raise ArtifactError(f"the BatchNorm statistics graph estimates {name!r}, which the "
                                "checkpoint does not hold; re-export the artifact")
        target = params[name].data
        if target.shape != value.shape:
            raise ArtifactError(f"the BatchNorm statistics graph gives {name!r} the shape "
                                f"{value.shape}, the checkpoint {target.shape}; re-export")
        target[...] = value.astype(target.dtype)
