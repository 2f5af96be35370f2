"""What the sigmoid-head calibrators share: their base class, the per-label closed-form fits, the piecewise maps."""
