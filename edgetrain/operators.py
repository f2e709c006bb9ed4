"""The operators an artifact's graphs may hold, by domain: the device's allowlist.

The exporter checks every graph it writes against this list (exporters/export/artifact.py) and the
runtime checks every graph it loads (edgetrain/graphcheck.py), so an artifact the exporter
made always loads, and a hand-made graph with anything else is refused before ONNX Runtime
sees it. What is left out, and why:

- control flow (If, Loop, Scan, SequenceMap): a subgraph's work and memory cannot be bounded
  before it runs (a Loop of 2^62 iterations hangs the device); no wearable layer needs one.
- AveragePool and AveragePoolGrad: onnxruntime-training 1.19.2's AveragePoolGrad dies with a
  floating-point exception (SIGFPE), and the exporter rewrites or refuses every average pool
  (exporters/export/operators.py).
- sequences, optionals, strings, random generators and detection heads: no layer the
  exporter supports emits one.
- ORT's host-only bridges (ATen, PythonOp, PythonOpGrad, YieldOp): they call back into torch
  or Python, which the device does not have.

The standard list is ONNX's operators up to opset 17 (the exporter's) less those; the
com.microsoft list is what ORT's gradient and optimizer builders and edgetrain's own graph
passes emit for the layers docs/byom.md lists (gathered by exporting every model of
tests/wearable_models.py and the built-in networks with every plan).
"""
from __future__ import annotations

from edgetrain.names import NCHWC_DOMAIN

MS_DOMAIN = "com.microsoft"

STANDARD = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh BatchNormalization BitShift
BlackmanWindow Cast CastLike Ceil Celu Clip Compress Concat Constant ConstantOfShape Conv
ConvInteger ConvTranspose Cos Cosh CumSum DFT DepthToSpace DequantizeLinear Det Div Dropout
DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather
GatherElements GatherND Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater
GreaterOrEqual GridSample HammingWindow HannWindow HardSigmoid HardSwish Hardmax Identity
InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log
LogSoftmax LpNormalization LpPool MatMul MatMulInteger Max MaxPool MaxUnpool Mean
MeanVarianceNormalization MelWeightMatrix Min Mod Mul Neg NegativeLogLikelihoodLoss NonZero
Not OneHot Or PRelu Pad Pow QLinearConv QLinearMatMul QuantizeLinear RNN Range Reciprocal
ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence Round STFT Scatter
ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh
ThresholdedRelu Tile TopK Transpose Trilu Unique Unsqueeze Upsample Where Xor
""".split())

MICROSOFT = frozenset("""
AdamWOptimizer BatchNormInternal BatchNormalizationGrad BiasFastGeluGrad_dX BiasGelu
BiasGeluGrad_dX BroadcastGradientArgs ConcatTraining ConvGrad ConvTransposeGrad DivGrad
DropoutGrad FastGelu FastGeluGrad FusedConv FusedGemm FusedMatMul GRUGrad GRUTraining
GatherElementsGrad GatherGrad GatherNDGrad Gelu GeluGrad InPlaceAccumulatorV2
LayerNormalizationGrad LeakyReluGrad LogSoftmaxGrad_13 LSTMGrad LSTMTraining MaxPoolGrad
PassThrough QuickGelu QuickGeluGrad ReduceSumTraining ReluGrad ResizeGrad SGDOptimizerV2
Scale SigmoidGrad SimplifiedLayerNormalization SimplifiedLayerNormalizationGrad SliceGrad
SoftmaxCrossEntropyLossGrad SoftmaxCrossEntropyLossInternal
SoftmaxCrossEntropyLossInternalGrad SoftmaxGrad_13 SplitTraining TanhGrad TransposeMatMul
ZeroGradient
""".split())

# ORT's blocked-channel kernels the exporter's NCHWc pass writes (exporters/passes/nchwc.py)
NCHWC = frozenset({"ReorderInput", "ReorderOutput", "Conv"})

# gradients ORT's training builder writes in the ONNX domain rather than com.microsoft
STANDARD_GRADIENTS = frozenset({"MaxPoolGrad"})

ALLOWED: dict[str, frozenset[str]] = {"": STANDARD | STANDARD_GRADIENTS,
                                      "ai.onnx": STANDARD | STANDARD_GRADIENTS,
                                      MS_DOMAIN: MICROSOFT, NCHWC_DOMAIN: NCHWC}

# Integer attributes that size a window or a step: each value within these bounds (a zero
# kernel or stride divides by zero in some kernels; a huge one only wastes the device).
WINDOW_ATTRIBUTES = {"kernel_shape": (1, 1 << 16), "strides": (1, 1 << 16),
                     "dilations": (1, 1 << 16), "pads": (0, 1 << 16), "group": (1, 1 << 20)}
# Where an attribute is not a window: MaxUnpool's kernel sets the length of the flat tensor it
# writes (the exporter's dense-weight builds: a masked weight's element count less its kept
# values plus one, exporters/passes/densebuild.py; 2.3 million for a ResNet-50 layer at density
# 0.1), so it is bounded as a tensor made from constants is: 256 MiB of float32.
OPERATOR_ATTRIBUTES = {"MaxUnpool": {"kernel_shape": (1, 1 << 26)}}


def allowed(domain: str, op_type: str) -> bool:
    return op_type in ALLOWED.get(domain, frozenset())
