"""Find a classifier's head and capture what it sees (the pre-classifier feature).

A forward pre-hook on the head gives exactly the classifier's input: ViT's final-norm CLS
token, Swin's and ResNet's pooled feature, a timm model's pooled feature. ``hidden_states``
would not (ViT's last hidden state is taken before the final LayerNorm).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

# attribute paths tried in order; the first that resolves to a module holding a Linear wins
_KNOWN_HEADS = (
    "classifier",  # ViT, Swin, DeiT, ConvNeXt (transformers)
    "timm_model.head.fc",  # TimmWrapperForImageClassification, ViT-style timm heads
    "timm_model.fc",  # TimmWrapperForImageClassification, ResNet-style timm heads
    "timm_model.head",
    "timm_model.classifier",
    "head.fc",
    "fc",  # timm / torchvision ResNet
    "head",
)


def _resolve(model: nn.Module, path: str) -> tuple[nn.Module, str, nn.Module] | None:
    parent = model
    *parents, last = path.split(".")
    for name in parents:
        parent = getattr(parent, name, None)
        if not isinstance(parent, nn.Module):
            return None
    module = getattr(parent, last, None)
    if not isinstance(module, nn.Module):
        return None
    # transformers ResNet: classifier = Sequential(Flatten, Linear); hook the Linear itself
    if isinstance(module, nn.Sequential) and len(module) and isinstance(module[-1], nn.Linear):
        return module, str(len(module) - 1), module[-1]
    # a head this package installed (MaC-Cal's bottleneck) says so: hook its input, as for a Linear
    if isinstance(module, nn.Sequential) and len(module) and getattr(module[-1], "_is_classifier_head", False):
        return module, str(len(module) - 1), module[-1]
    if isinstance(module, nn.Linear) or getattr(module, "_is_classifier_head", False):
        return parent, last, module
    return None


def find_classifier_head(model: nn.Module, head: str | None = None) -> tuple[nn.Module, str, nn.Module]:
    """Locate the final linear classification layer.

    Args:
        model: a transformers / timm image classifier.
        head: dotted attribute path of the head (e.g. ``"classifier"``) for models we don't know.

    Returns:
        ``(parent, attribute_name, linear)`` so that ``getattr(parent, attribute_name) is linear``
        and the head can be replaced with ``setattr``.
    """
    if head is not None:
        if not isinstance(head, str):
            raise TypeError(f"Expected argument `head` to be a dotted attribute path (str), but got {head!r}.")
        found = _resolve(model, head)
        if found is None:
            raise ValueError(f"Expected argument `head` to name a Linear layer of the model, but {head!r} is not one.")
        return found
    if hasattr(model, "get_classifier") and isinstance(model.get_classifier(), nn.Linear):  # timm
        linear = model.get_classifier()
        for name, module in model.named_modules():
            if module is linear:
                return _resolve(model, name)
    for path in _KNOWN_HEADS:
        found = _resolve(model, path)
        if found is not None:
            return found
    raise ValueError(
        f"Could not find the classification head of {type(model).__name__}: pass `head=` with the dotted "
        "path of its final Linear layer (for example head='classifier')."
    )


class FeatureCapture:
    """Forward pre-hook that records the input of the classification head on each forward pass."""

    def __init__(self, model: nn.Module, head: str | None = None):
        _, _, self.head = find_classifier_head(model, head)
        self.features: torch.Tensor | None = None
        self._handle = None

    def _hook(self, module, args):
        self.features = args[0]

    def attach(self) -> FeatureCapture:
        if self._handle is None:
            self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.features = None

    def pop(self) -> torch.Tensor | None:
        """The last captured features, cleared so a stale batch is never reused."""
        features, self.features = self.features, None
        return features


@contextmanager
def capture_features(model: nn.Module, head: str | None = None):
    """``with capture_features(model) as cap: model(x); cap.pop()`` → the head's input."""
    cap = FeatureCapture(model, head).attach()
    try:
        yield cap
    finally:
        cap.remove()
