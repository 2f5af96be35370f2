"""Shared fixtures of the MaC-Cal tests: a briefly trained tiny ViT (the stage needs a backbone past its random init)."""

from __future__ import annotations

import pytest
import torch
from _models import digits, make_model
from torch.nn import functional as F


def train_briefly(model, x, y, steps=30, seed=0):
    """A few Adam steps so the backbone is no longer at its random init."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for i in range(steps):
        idx = torch.arange(i * 32, i * 32 + 32) % len(y)
        loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def trained_vit():
    x, y = digits(slice(0, 256))
    return train_briefly(make_model("vit", seed=0), x, y)


@pytest.fixture(name="train_briefly", scope="session")
def _train_briefly_fixture():
    return train_briefly
