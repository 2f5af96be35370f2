"""`MaCCalConfig`: every constant of the MaC-Cal second stage (Ni et al. 2025), with its default and its source."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hf_calibration._core.checks import check_choice, check_float, check_int

__all__ = ["MaCCalConfig"]


@dataclass
class MaCCalConfig:
    """Every constant of the MaC-Cal stage, with its default and where it comes from.

    How the defaults were chosen (``benchmarks/training_cifar.py --explore-maccal``, RESULTS.md): 34 variants of the
    stage, each run on the saved features of three over-confident cross-entropy models (CIFAR-10, a small ResNet that
    fits its 8,000 training images: test ECE 16.94 ± 0.45 %, accuracy 57.05 %), chosen on the validation split.

    * **The data.** Every variant retrained on the training images, the paper's choice, made ECE about twice as bad
      (validation 29.8-39.2 % against stage 1's 16.7 %): the training features of a backbone that fits its training
      set are nearly separable, so a head retrained there relearns the over-confidence. Every variant retrained on
      5,000 held-out images lowered it. Pass held-out data (``maccal_dataset=`` of ``CalibrationTrainer``, or the
      ``dataset`` / ``features`` of ``maccal_stage``): the configuration cannot choose the data.
    * **Few epochs from the trained head, a small step** (``epochs=5``, ``init="linear"``, ``lr=0.01``): validation
      ECE 1.59 ± 0.44 % at -0.19 points of accuracy; a fresh head lost 3-6 points of accuracy (5.00 %, 50.5 %), 40
      epochs over-fitted the held-out set (11.2 %), lr 0.1 / 0.03 / 0.003 gave 4.97 / 3.03 / 4.40 %.
    * **The masks.** Starting from ρ₀ = 1 (no mask) with the adaptive rule, over-confident heads keep ρ = 1 for the
      whole stage: no weight is masked, and the gain is the retraining itself. Masking did not help: ρ₀ = 0.9
      adaptive 1.97 %, fixed ρ = 0.9 3.94 %, the opposite direction of the rule 7.29 %, no 1/ρ rescaling 1.79 %; the
      rule still masks a head that becomes under-confident (κ·acc > conf), the case the paper pairs with Mixup.
      Feedback from the unmasked head or κ = 1 changed nothing here (ρ stays at 1 either way).
    * Test split, same models: ECE 16.94 → 1.31 ± 0.41 %, lower on 3 of 3, accuracy +0.12 points;
      temperature scaling fitted on the same held-out images gives 1.23 ± 0.32 %.

    Args:
        epochs: stage-2 epochs (paper: "a few epochs (e.g. 5)"; its schedule: 40).
        lr: SGD learning rate, constant over the stage (paper: 0.1; 0.01 chosen on validation, above).
        momentum: SGD momentum (paper: 0.9, as in its stage-1 recipe).
        weight_decay: L2 weight decay on the head's weight matrices, not biases (paper recipe: 5e-4).
            Masked entries get neither gradient, decay nor momentum (see ``MaskedSGD``).
        batch_size: head-training batch size on the cached features (paper: 128).
        hidden: bottleneck width ``h``; ``None`` → ``max(in_features // 2, 2 · num_labels)``.
        rho0: initial mask retention probability ρ₀ in (0, 1] (1: no mask until the rule lowers it).
        adaptive: adapt ρ each epoch (rule in the module docstring); ``False`` keeps ρ = ρ₀.
        kappa: κ, discount on the training accuracy in ``κ·acc − conf``.
        step: gain applied to ``κ·acc − conf`` before clipping.
        clip_bound: τ₀, the largest change of ρ in one epoch at the start of the stage.
        clip_decay: γ in ``τ_t = τ₀ · exp(−γ · t / epochs)``: the bound ends at ``τ₀·e^{−γ}``.
        rho_min, rho_max: bounds ρ is kept in (with ``rescale``, ρ near 0 multiplies the kept
            weights by up to 1/ρ and training collapses: measured at ρ = 0.05).
        rescale: scale masked weights by ``1/ρ`` in training (inverted-dropout style) so the full
            weights at inference match the training-time expectation. Without it the full-weight
            head is sharper than the masked one it was trained as (measured: ECE 6.48 % vs 5.76 %).
        init: ``"linear"`` (default): the bottleneck starts as exactly the trained linear head it replaces
            (``MaskedBottleneckHead.init_from_linear``; needs ``hidden >= 2K``); ``"fresh"``: a freshly initialised
            head, as the paper's text reads (lost 3-6 points of accuracy here).
        feedback: what the ρ update measures after each epoch: ``"masked"``, the masked training passes, or
            ``"full"``, the unmasked head (what inference uses) on the same batches, before each step.
        cache_features: compute the backbone features once (default). ``False`` re-runs the frozen
            backbone every epoch (only for data whose features do not fit in memory).
        feature_batch_size: batch size of the backbone forward passes.
        seed: seeds the head's initialisation, the masks and the shuffling.
        progress: show tqdm bars.
    """

    epochs: int = 5
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 128
    hidden: int | None = None
    rho0: float = 1.0
    adaptive: bool = True
    kappa: float = 0.97
    step: float = 1.0
    clip_bound: float = 0.1
    clip_decay: float = 3.0
    rho_min: float = 0.5
    rho_max: float = 1.0
    rescale: bool = True
    init: str = "linear"
    feedback: str = "masked"
    cache_features: bool = True
    feature_batch_size: int = 256
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        check_int(self.epochs, "epochs", minimum=1)
        check_float(self.lr, "lr", minimum=0.0, min_inclusive=False)
        check_float(self.momentum, "momentum", minimum=0.0, maximum=1.0, max_inclusive=False)
        check_float(self.weight_decay, "weight_decay", minimum=0.0)
        check_int(self.batch_size, "batch_size", minimum=1)
        if self.hidden is not None:
            check_int(self.hidden, "hidden", minimum=1)
        check_float(self.rho_min, "rho_min", minimum=0.0, maximum=1.0, min_inclusive=False)
        check_float(self.rho_max, "rho_max", minimum=0.0, maximum=1.0, min_inclusive=False)
        if self.rho_min > self.rho_max:
            raise ValueError(
                f"Expected argument `rho_min` to be <= `rho_max`, but got {self.rho_min} > {self.rho_max}."
            )
        check_float(self.rho0, "rho0", minimum=0.0, maximum=1.0, min_inclusive=False)
        if not self.rho_min <= self.rho0 <= self.rho_max:
            raise ValueError(
                f"Expected argument `rho0` to lie in [rho_min, rho_max] = [{self.rho_min}, {self.rho_max}], but got {self.rho0}."
            )
        for name in ("adaptive", "rescale", "cache_features", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Expected argument `{name}` to be a bool, but got {getattr(self, name)!r}.")
        check_choice(self.init, "init", ("fresh", "linear"))
        check_choice(self.feedback, "feedback", ("masked", "full"))
        check_float(self.kappa, "kappa", minimum=0.0, min_inclusive=False)
        check_float(self.step, "step", minimum=0.0, min_inclusive=False)
        check_float(self.clip_bound, "clip_bound", minimum=0.0, min_inclusive=False)
        check_float(self.clip_decay, "clip_decay", minimum=0.0)
        check_int(self.feature_batch_size, "feature_batch_size", minimum=1)
        check_int(self.seed, "seed", minimum=0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
