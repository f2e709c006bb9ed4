"""Small wearable models for the conformance matrix (tests/test_conformance.py): one per layer
family edgetrain supports, each with the sample shape such a model reads. Built here, with
made-up weights; none is a built-in network."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 3


class Classify(nn.Module):
    """body: [B, ...] -> [B, features]; then a linear head."""

    def __init__(self, body: nn.Module, features: int):
        super().__init__()
        self.body, self.head = body, nn.Linear(features, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.a, self.b = nn.Conv1d(c, c, 3, padding=1), nn.Conv1d(c, c // 2, 5, padding=2)

    def forward(self, x):  # residual add, then a concat of two branches
        y = x + F.relu(self.a(x))
        return torch.cat([y, self.b(y)], dim=1)


class Attention(nn.Module):
    """Hand-written attention with F.scaled_dot_product_attention, over [B, T, d]."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        return self.out(y).mean(dim=1)


class MhaBlock(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.embed = nn.Linear(6, d)
        self.position = nn.Embedding(32, d)
        self.attn, self.norm = nn.MultiheadAttention(d, 4, batch_first=True), nn.LayerNorm(d)

    def forward(self, x):  # [B, T, 6]
        h = self.embed(x) + self.position(torch.arange(x.shape[1]))
        y, _ = self.attn(h, h, h, need_weights=False)
        return self.norm(h + y).mean(dim=1)


class Recurrent(nn.Module):
    def __init__(self, cell: type):
        super().__init__()
        self.rnn = cell(6, 12, batch_first=True)

    def forward(self, x):  # [B, T, 6] -> the last step's state
        return self.rnn(x)[0][:, -1]


class MoeBlock(nn.Module):
    """Transformer block whose feed-forward is a mixture of experts (seed 001's shape): a gate,
    top-k routing, expert MLPs weighted by their gate scores."""

    def __init__(self, d: int = 16, experts: int = 4, k: int = 2):
        super().__init__()
        self.embed, self.k = nn.Linear(6, d), k
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                                   nn.Linear(2 * d, d)) for _ in range(experts))

    def forward(self, x):  # [B, T, 6]
        h = self.embed(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.norm1(h + a)
        top, idx = self.gate(h).softmax(-1).topk(self.k, dim=-1)
        mixed = torch.zeros_like(h)
        for j, expert in enumerate(self.experts):
            mixed = mixed + (top * (idx == j)).sum(-1, keepdim=True) * expert(h)
        return self.norm2(h + mixed).mean(dim=1)


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    layout: str
    predictable: bool  # the static predictor claims a peak (else it says it cannot)
    freeze_batchnorm: bool = False


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return Classify(nn.Sequential(nn.Linear(6, 16), nn.TransformerEncoder(
        layer, 2, enable_nested_tensor=False)), 16 * 16)


CASES: dict[str, Case] = {
    "cnn1d_bn": Case(lambda: Classify(nn.Sequential(
        nn.Conv1d(6, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(8, 8, 3, padding=1), nn.AdaptiveAvgPool1d(1)), 8), (6, 32), "CT", True),
    "cnn1d_frozen_bn": Case(lambda: Classify(nn.Sequential(
        nn.Conv1d(6, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1)), 8), (6, 32), "CT", True, freeze_batchnorm=True),
    "cnn1d_depthwise_dilated": Case(lambda: Classify(nn.Sequential(
        nn.Conv1d(6, 6, 3, padding=2, dilation=2, groups=6), nn.ReLU6(), nn.Conv1d(6, 8, 1),
        nn.Hardswish(), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(1)), 8), (6, 32), "CT", True),
    "tcn_same_padding": Case(lambda: Classify(nn.Sequential(  # padding="same" exports SAME,
        nn.Conv1d(6, 8, 3, padding="same", dilation=2), nn.ReLU(),  # which ORT's Conv refuses
        nn.Conv1d(8, 8, 4, padding="same", dilation=4), nn.SiLU(),  # with a dilation
        nn.AdaptiveAvgPool1d(1)), 8), (6, 32), "CT", True),
    "cnn1d_activations": Case(lambda: Classify(nn.Sequential(  # ELU, PReLU, SELU, CELU and
        nn.Conv1d(6, 8, 3, padding=1), nn.ELU(0.5), nn.Conv1d(8, 8, 3), nn.PReLU(8),
        nn.Conv1d(8, 8, 1), nn.SELU(), nn.Conv1d(8, 8, 1), nn.CELU(2.0),  # global max pooling
        nn.Conv1d(8, 8, 1), nn.LeakyReLU(0.1), nn.Conv1d(8, 8, 1), nn.Tanh(),  # rewritten
        nn.Conv1d(8, 8, 1), nn.Sigmoid(), nn.Conv1d(8, 8, 1), nn.Softplus(),  # (rewrites.py)
        nn.Conv1d(8, 8, 1), nn.Mish(), nn.AdaptiveMaxPool1d(1)), 8),
        (6, 32), "CT", True),
    "cnn2d": Case(lambda: Classify(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1)), 8),
        (3, 16, 16), "CHW", True),
    "norms_activations": Case(lambda: Classify(nn.Sequential(
        nn.Conv1d(6, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU(), nn.Dropout(0.0),
        nn.Conv1d(8, 8, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool1d(1)), 8),
        (6, 32), "CT", True),
    "residual_concat": Case(lambda: Classify(nn.Sequential(
        nn.Conv1d(6, 8, 3, padding=1), Residual(8), nn.AvgPool1d(8)), 12 * 4),
        (6, 32), "CT", True),
    "mlp_layernorm": Case(lambda: Classify(nn.Sequential(
        nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 8)), 8 * 16),
        (16, 6), "TF", True),
    "sdpa": Case(lambda: Classify(nn.Sequential(nn.Linear(6, 16), Attention()), 16),
                 (16, 6), "TF", True),
    "mha_embedding": Case(lambda: Classify(MhaBlock(), 16), (16, 6), "TF", True),
    "transformer_encoder": Case(_encoder, (16, 6), "TF", True),
    "moe_transformer": Case(lambda: Classify(MoeBlock(), 16), (16, 6), "TF", False),
    "gru": Case(lambda: Classify(Recurrent(nn.GRU), 12), (16, 6), "TF", False),
    "lstm": Case(lambda: Classify(Recurrent(nn.LSTM), 12), (16, 6), "TF", False),
}
