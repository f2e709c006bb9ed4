"""The manifest's JSON checked field by field, before any part of it is used.

A manifest is input like any other: it may be damaged or written by someone hostile. Every
field the runtime reads is checked for its JSON type and range here (a `files` list where an
object belongs, a micro-batch written as a string, a negative shape, a sample shape whose
elements overflow), so a bad manifest is an ArtifactError naming the field, never a crash
deep inside training. Sample shapes are bounded (MAX_SAMPLE_ELEMENTS) and must agree with the
plan's patching: a whole image [C, H, W] is cut into [C, p, p] patches, or is the sample.
"""
from __future__ import annotations

import math

from edgetrain.specs import ArtifactError

MAX_SAMPLE_ELEMENTS = 1 << 28  # elements of one whole sample (1 GiB of float32)
# plan fields that default to None and hold a number that need not be whole (others: int)
OPTIONAL_PLAN_KINDS = {"recompute_time_ratio": float}
_JSON = {int: "a whole number", str: "a string", float: "a number", dict: "an object",
         list: "a list", bool: "true or false"}


def _fail(field: str, value, want: str):
    text = repr(value)
    raise ArtifactError(f"manifest field {field} is {text[:80]}{'…' if len(text) > 80 else ''}"
                        f", not {want}; the artifact is refused (re-export it)")


def expect(value, kind, field: str, optional: bool = False):
    """value if it is of JSON kind `kind` (int excludes bool; float takes ints), else refuse."""
    if value is None and optional:
        return value
    if value is None:
        raise ArtifactError(f"manifest field {field} is missing; the artifact is refused "
                            "(re-export it)")
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else
          isinstance(value, kind))
    if not ok:
        _fail(field, value, _JSON[kind])
    return value


def shape(value, field: str, positive: bool = True) -> tuple[int, ...]:
    dims = expect(value, list, field)
    for d in dims:
        if expect(d, int, field) < (1 if positive else 0):
            _fail(field, value, f"a list of {'positive' if positive else 'non-negative'} "
                  "whole numbers")
    return tuple(dims)


def check_dict(d: dict, plan_fields) -> None:
    """Refuse a manifest dict (json.loads of manifest.json) with a field of the wrong type."""
    expect(d, dict, "(the whole manifest)")
    expect(d.get("model"), str, "model")
    files = expect(d.get("files"), dict, "files")
    for role, f in files.items():
        expect(f, dict, f"files.{role}")
        expect(f.get("path"), str, f"files.{role}.path")
        expect(f.get("size_bytes"), int, f"files.{role}.size_bytes")
        expect(f.get("sha256"), str, f"files.{role}.sha256")
    inp = expect(d.get("input"), dict, "input")
    for key in ("name", "dtype", "label_name"):
        expect(inp.get(key), str, f"input.{key}")
    expect(inp.get("preprocess", "none"), str, "input.preprocess")
    expect(inp.get("layout", ""), str, "input.layout")
    args = expect(inp.get("preprocess_args", {}), dict, "input.preprocess_args")
    if inp.get("dtype") != "float32":
        _fail("input.dtype", inp.get("dtype"), '"float32"')
    for key in ("sample_shape", "image_shape"):
        dims = shape(inp.get(key), f"input.{key}")
        n = 1
        for dim in dims:
            n *= dim
        if n > MAX_SAMPLE_ELEMENTS:
            _fail(f"input.{key}", dims, f"a sample of at most {MAX_SAMPLE_ELEMENTS} elements")
    if inp.get("preprocess") in ("imu_gasf", "imu_window"):
        expect(args.get("window_samples"), int, "input.preprocess_args.window_samples")
        for key in ("mean", "scale"):
            values = expect(args.get(key), list, f"input.preprocess_args.{key}")
            if len(values) != 6 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                       or not math.isfinite(v) for v in values):
                _fail(f"input.preprocess_args.{key}", values, "a list of 6 finite numbers")
            if key == "scale" and any(v == 0 for v in values):  # windows divide by it
                _fail("input.preprocess_args.scale", values, "a list of 6 non-zero numbers")
    classes = expect(d.get("classes"), list, "classes")
    if not classes or not all(isinstance(c, str) for c in classes):
        _fail("classes", classes, "a non-empty list of class names")
    for group in ("trainable", "frozen"):
        for i, t in enumerate(expect(d.get(group), list, group)):
            expect(t, dict, f"{group}[{i}]")
            expect(t.get("name"), str, f"{group}[{i}].name")
            expect(t.get("dtype"), str, f"{group}[{i}].dtype")
            shape(t.get("shape"), f"{group}[{i}].shape", positive=False)
    plan = expect(d.get("plan"), dict, "plan")
    for f in plan_fields:
        if f.name not in plan:
            continue
        value, default = plan[f.name], f.default
        if isinstance(default, tuple):
            if not all(isinstance(v, str) for v in expect(value, list, f"plan.{f.name}")):
                _fail(f"plan.{f.name}", value, "a list of tensor names")
        else:
            kind = type(default) if default is not None else OPTIONAL_PLAN_KINDS.get(f.name, int)
            expect(value, kind, f"plan.{f.name}", optional=default is None)
    for key in ("micro_batch", "accumulation_steps"):
        if key in plan and plan[key] < 1:
            _fail(f"plan.{key}", plan[key], "a whole number of at least 1")
    if plan.get("target", "host") not in ("portable", "arm64", "host"):  # edgetrain/targets.py
        _fail("plan.target", plan["target"], "portable, arm64 or host")
    if plan.get("patch_size", 0) < 0:
        _fail("plan.patch_size", plan["patch_size"], "0 (no patches) or a patch size")
    for key in ("optimizer", "predicted", "provenance"):
        expect(d.get(key), dict, key)
    flops = expect(d["predicted"].get("step_flops"), int, "predicted.step_flops", optional=True)
    if flops is not None and flops < 0:  # sizes the step watchdog's bound (edgetrain/watchdog.py)
        _fail("predicted.step_flops", flops, "a whole number of at least 0")
    for i, m in enumerate(expect(d.get("masks", []), list, "masks")):
        expect(m, dict, f"masks[{i}]")
        for key in ("weight", "values", "positions"):
            expect(m.get(key), str, f"masks[{i}].{key}")
        expect(m.get("nnz"), int, f"masks[{i}].nnz")
        shape(m.get("shape"), f"masks[{i}].shape")
    expect(d.get("dense_weights", {}), dict, "dense_weights")


def check_plan_values(plan, saved_activations, adapt_roles, preflight_orders) -> None:
    """Raise ValueError unless the plan's fields hold values the runtime can act on."""
    if plan.preflight_order not in preflight_orders:
        raise ValueError(f"plan.preflight_order is {plan.preflight_order!r}; it must be one "
                         f"of {list(preflight_orders)}")
    if plan.saved_activations not in saved_activations:
        raise ValueError(f"plan.saved_activations is {plan.saved_activations!r}; it must be "
                         f"one of {list(saved_activations)}")
    if plan.batchnorm_adapt not in adapt_roles:
        raise ValueError(f"plan.batchnorm_adapt is {plan.batchnorm_adapt!r}; it must be one "
                         f"of {sorted(adapt_roles)}")
    for field in ("micro_batch", "accumulation_steps", "threads"):
        value = getattr(plan, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"plan.{field} is {value!r}; it must be a whole number of at "
                             "least 1")
    if isinstance(plan.patch_size, bool) or not isinstance(plan.patch_size, int) \
            or plan.patch_size < 0:
        raise ValueError(f"plan.patch_size is {plan.patch_size!r}; it must be a whole "
                         "number of pixels (0: whole images)")


def check_patching(sample: tuple[int, ...], image: tuple[int, ...], patch: int) -> None:
    """A whole sample (image) is the model's sample, or cut into [C, patch, patch] patches."""
    if patch == 0:
        if tuple(sample) != tuple(image):
            _fail("input.image_shape", list(image), f"the sample shape {list(sample)} (the "
                  "plan cuts no patches)")
        return
    if (len(image) != 3 or tuple(sample) != (image[0], patch, patch)
            or image[1] % patch or image[2] % patch):
        _fail("input.image_shape", list(image), f"an image [C, H, W] that {patch}x{patch} "
              f"patches of shape {list(sample)} tile")

