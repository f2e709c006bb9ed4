"""What an artifact's tensors and samples look like: the specs the manifest is made of, and the
error every refusal of an artifact raises."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


class ArtifactError(ValueError):
    """The artifact folder is missing, malformed, tampered with or of another schema version."""


@dataclass(frozen=True)
class TensorSpec:
    name: str  # PyTorch fully-qualified name, e.g. "features.0.conv.weight"
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name, e.g. "float32"

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * itemsize(self.dtype)


PREPROCESSES = ("none", "imu_gasf", "imu_window")
IMU_CHANNELS = 6  # ax, ay, az, wx, wy, wz


@dataclass(frozen=True)
class InputSpec:
    """What one sample given to the runtime looks like (the leading batch axis is implicit)."""

    name: str  # graph input name
    sample_shape: tuple[int, ...]  # shape of one model input, e.g. (3, 32, 32), (6, 200)
    dtype: str
    label_name: str  # graph input name of the labels
    # One whole sample before patching, e.g. (3, 224, 224); equals sample_shape without patching.
    image_shape: tuple[int, ...]
    # How a user's `x` array is turned into model inputs, applied on device:
    #   "none": x is [N, *image_shape] already (any number of axes)
    #   "imu_gasf": x is [N, window_samples, 6] raw IMU windows, made into GASF images
    #   "imu_window": x is [N, window_samples, 6] raw IMU windows, standardised per channel
    #     (mean, scale) and laid out as the layout says: "CT" -> [6, T], "TC" -> [T, 6]
    preprocess: str = "none"
    preprocess_args: dict = field(default_factory=dict)
    # Names of the sample's axes, one letter each: C channels, H/W image rows/columns,
    # T time, F features ("CHW", "CT", "TF"); "" when the exporter was not told.
    layout: str = ""

    def __post_init__(self):
        if self.preprocess not in PREPROCESSES:
            raise ArtifactError(f"unknown preprocess {self.preprocess!r}; this runtime knows "
                                f"{', '.join(PREPROCESSES)}")
        if self.layout and len(self.layout) != len(self.sample_shape):
            raise ArtifactError(f"input layout {self.layout!r} names {len(self.layout)} axes, "
                                f"the sample shape {list(self.sample_shape)} has "
                                f"{len(self.sample_shape)}; re-export the artifact")
        if self.preprocess == "imu_window":
            t = int(self.preprocess_args.get("window_samples", -1))
            want = {"CT": (IMU_CHANNELS, t), "TC": (t, IMU_CHANNELS)}.get(self.layout)
            if want is None or tuple(self.sample_shape) != want:
                raise ArtifactError(
                    f"preprocess imu_window needs layout CT or TC and a sample of "
                    f"[{IMU_CHANNELS}, window_samples] or [window_samples, {IMU_CHANNELS}]; "
                    f"the manifest says layout {self.layout!r}, sample "
                    f"{list(self.sample_shape)}; re-export the artifact")

    def data_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the `x` array a user supplies."""
        if self.preprocess == "none":
            return self.image_shape
        return (int(self.preprocess_args["window_samples"]), IMU_CHANNELS)


@dataclass(frozen=True)
class MaskSpec:
    """A sparse weight, addressed by its PyTorch name (`blocks.3.pw.0.weight`). The artifact
    holds only its kept values (trainable, [nnz]) and their positions in the flattened dense
    weight (frozen int32, [nnz]); the dense weight is built inside the step."""

    weight: str  # the dense weight's fully-qualified name
    shape: tuple[int, ...]  # the dense weight's shape
    nnz: int  # kept weights
    values: str  # name of the trainable tensor [nnz]
    positions: str  # name of the frozen int32 tensor [nnz]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def density(self) -> float:
        return self.nnz / self.numel


def itemsize(dtype: str) -> int:
    sizes = {"float32": 4, "float64": 8, "float16": 2, "int64": 8, "int32": 4, "int8": 1,
             "uint8": 1, "bool": 1}
    if dtype not in sizes:
        raise ArtifactError(f"unsupported tensor dtype {dtype!r}")
    return sizes[dtype]


def check_logits(shape, batch: int, classes: int) -> None:
    """The training graph's logits must be [batch, classes] for the manifest's classes, or a
    label the manifest allows could index past the graph's logits inside ORT's loss."""
    if tuple(shape) != (batch, classes):
        raise ArtifactError(f"the training graph gives logits of shape {tuple(shape)}, but the "
                            f"manifest lists {classes} classes (micro-batch {batch}): a label "
                            "beyond the graph's logits would reach its loss. The artifact is "
                            "refused; re-export it")
