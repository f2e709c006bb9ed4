"""A model must return one [batch, classes] tensor of logits: anything else is refused at
export with what it returned and what to change, and nothing is written."""
from __future__ import annotations

import pytest
import torch

from exporters.export import export_artifact
from exporters.export.logits import LogitsError


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = torch.nn.Conv1d(6, 8, 3), torch.nn.Linear(8, 3)

    def forward(self, x):
        features = self.conv(x).mean(-1)
        return self.head(features), features


def flat(out: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv1d(6, 4, 3), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 14, out))


@pytest.mark.parametrize("model, classes, words", [
    (TwoOutputs, 3, "returns 2 tensors"),
    (lambda: flat(4), 3, "shape ['batch', 4]; edgetrain trains class logits of shape [batch, 3]"),
    (lambda: flat(3), 4, "pass 3 class names"),
    (lambda: torch.nn.Conv1d(6, 3, 3), 3, "Reduce its output to one row of 3 logits"),
    (lambda: flat(1), 1, "at least two"),
])
def test_a_model_that_does_not_return_class_logits_is_refused(tmp_path, model, classes, words):
    with pytest.raises(LogitsError, match="Nothing was written") as e:
        export_artifact(model(), torch.zeros(2, 6, 16), tmp_path / "art",
                        classes=[f"c{i}" for i in range(classes)])
    assert words in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_logits_of_as_many_classes_as_names_export(tmp_path):
    m = export_artifact(flat(3), torch.zeros(2, 6, 16), tmp_path / "art", classes=["a", "b", "c"])
    assert m.classes == ("a", "b", "c")
