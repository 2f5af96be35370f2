"""FeDLaS loss, gate and straight-through sign in one autograd node, with hand-derived gradients.

The per-sample formulas are those of `fedlas.FeDLaSLoss.per_sample_loss` (paper Eqs. 4, 7-9) and the
reduction that of `_base._reduce`, computed with the same operations in the same order, so the forward
value is bit for bit the unfused one. What this saves is host time: the unfused graph dispatches about
a hundred small operations and as many autograd nodes per step, which on a GPU whose step is bound by
the host's dispatch rate cost several percent of the step; here forward and backward are a few dozen
operations without autograd recording.

Notation (one row i; ``c_i`` = upstream gradient / denominator on kept rows, 0 on ignored rows)::

    d = o1 - o0,  o = G(sg[z])           ψ = sign(d) = sign(p1 - p0) = sign(tanh(d/2))
    s = ψ·(β·γ),  r = 2·base·σ(s)
    LS:   L = nll + r·(u - nll),   u = mean_k(-log p_k)
    MbLS: L = (1 - r)·nll + r·R,   R = mean_k relu(max_j z_j - z_k - m)

    ∂L/∂z (LS)   = c·(p - (1 - r)·onehot(y) - r/K)
    ∂L/∂z (MbLS) = c·(1 - r)·(p - onehot(y)) + c·r/K·(n_act·onehot(argmax z) - act),
                   act_k = [max_j z_j - z_k - m > 0], n_act = Σ_k act_k
    ∂L/∂r = c·(Q - nll), Q = u or R;  ∂r/∂s = 2·base·σ(s)(1 - σ(s));  ∂s/∂ψ = β·γ
    straight-through: ∂ψ/∂d := g·∂tanh(d/2)/∂d = g·2·σ(d)(1 - σ(d)), g = +1 (descent, the official code) or -1
    (ascent, the default: the gate climbs the loss, see `fedlas.FeDLaSLoss`); then ∂/∂(o0, o1) = (-1, +1)·∂/∂d
    and the gate's two linear layers and LeakyReLU by hand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

_LEAKY_SLOPE = 0.01  # the gate's LeakyReLU slope (BidirectionalCalibrationGate)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


class FeDLaSFunction(torch.autograd.Function):
    """``apply(logits, w1, b1, w2, b2, gamma, labels, mask, denom, variant, base, beta, margin, gate_sign)`` → ``(loss, r, ψ > 0)``.

    ``logits`` (N, K) already upcast; ``w1, b1, w2, b2`` the gate's ``fc_in`` / ``fc_out`` parameters;
    ``gamma`` (N,) the NCI γ_i (no gradient); ``labels`` (N,) valid class indices (ignored rows replaced);
    ``mask`` (N,) kept rows; ``denom`` the reduction's denominator (tensor or number). Gradients flow to the
    logits and to the gate parameters (the weights r and the sign mask are returned without gradient, for
    inspection); the node is not twice differentiable. ``gate_sign`` multiplies the gate's gradients: +1 gives the
    gradient of the loss (descent), -1 its negative (ascent).
    """

    @staticmethod
    def forward(ctx, logits, w1, b1, w2, b2, gamma, labels, mask, denom, variant, base, beta, margin, gate_sign=1.0):
        # gate (under the caller's autocast, exactly like the module): d = o1 - o0 of G(sg[z])
        x = _as(logits, w1.dtype)
        h = F.linear(x, w1, b1)
        a = F.leaky_relu(h, _LEAKY_SLOPE)
        o0, o1 = F.linear(a, w2, b2).unbind(1)
        d = o1 - o0
        if d.dtype not in (torch.float32, torch.float64):
            d = d.float()
        positive = d > 0  # ψ = +1 where p1 > p0
        # ψ·γ·β in the unfused dtype (float64 if either side is); negating is exact, so ±(γ·β) is it bit for bit
        gb = _as(gamma, torch.float64 if torch.float64 in (d.dtype, gamma.dtype) else gamma.dtype) * beta
        sig = torch.sigmoid(torch.where(positive, gb, -gb))  # σ(ψ·γ·β)
        weights = _as(sig * (2 * base), logits.dtype)  # r = 2·base·σ(·), as σ(x)·(2·base): exact at β = 0

        log_probs = F.log_softmax(logits, dim=-1)
        nll = F.nll_loss(log_probs, labels, reduction="none")
        if variant == "ls":  # as label_smoothing_per_sample: nll + r·(u - nll) with u - nll = -(mean_k log p_k + nll)
            gap = log_probs.mean(dim=-1) + nll  # = -(u - nll)
            per_sample = nll - weights * gap
            top_index = active_in = None
        else:
            top, top_index = logits.max(dim=-1, keepdim=True)
            active_in = top - logits - margin
            penalty = F.relu(active_in).mean(dim=-1)
            per_sample = (1 - weights) * nll + weights * penalty
            gap = penalty  # R; the gap R - nll is formed in backward, only when the gate needs it
        loss = torch.where(mask, per_sample, 0.0).sum() / denom

        ctx.set_materialize_grads(False)  # no zero tensors for the two outputs without gradient
        ctx.save_for_backward(x, h, a, w2, d, gb, sig, weights, log_probs, nll, gap, labels, mask, top_index, active_in)
        ctx.variant, ctx.base, ctx.denom, ctx.gate_sign = variant, base, denom, gate_sign
        ctx.mark_non_differentiable(weights, positive)
        return loss, weights, positive

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, _grad_weights, _grad_positive):
        x, h, a, w2, d, gb, sig, weights, log_probs, nll, gap, labels, mask, top_index, active_in = ctx.saved_tensors
        grads = [None] * 14
        if grad_out is None:  # only the non-differentiable outputs were used
            return tuple(grads)
        c = torch.where(mask, grad_out / ctx.denom, 0.0)  # ∂loss/∂L_i
        if ctx.needs_input_grad[0]:
            # ∂/∂log p: -c·(1 - r) at the label (nll_loss's own backward), minus c·r/K everywhere for LS;
            # log_softmax's backward then adds c·p (the row sums are -c), giving the formulas above
            num_classes = log_probs.shape[1]
            cw = c * weights
            tw = _as(grad_out, log_probs.dtype)  # nll_loss_backward's total_weight: unused without reduction
            grad = torch.ops.aten.nll_loss_backward(c - cw, log_probs, labels, None, 0, -100, tw)
            if ctx.variant == "ls":
                grad.sub_((cw / num_classes).unsqueeze(1))
                grad = torch._log_softmax_backward_data(grad, log_probs, 1, log_probs.dtype)
            else:
                grad = torch._log_softmax_backward_data(grad, log_probs, 1, log_probs.dtype)
                c_pen = (cw / num_classes).unsqueeze(1)
                active = active_in > 0
                grad.sub_(active * c_pen)
                grad.scatter_add_(1, top_index, active.sum(dim=1, keepdim=True) * c_pen)
            grads[0] = grad
        if any(ctx.needs_input_grad[1:5]):
            # ∂L/∂r = Q - nll: -gap for LS, R - nll for MbLS
            if ctx.variant == "ls":
                grad_r, scale = c * gap, -4 * ctx.base * ctx.gate_sign
            else:
                grad_r, scale = c * (gap - nll), 4 * ctx.base * ctx.gate_sign
            # r = 2·base·σ(s), s = ψ·βγ, ψ ≈ tanh(d/2) with ∂/∂d = 2σ(d)(1 - σ(d)): constants folded into `scale`
            grad_s = torch.ops.aten.sigmoid_backward(_as(grad_r, sig.dtype) * scale, sig)
            grad_d = torch.ops.aten.sigmoid_backward(grad_s * gb, torch.sigmoid(d))
            grad_o = torch.stack((-grad_d, grad_d), dim=1)
            dtype = grad_o.dtype
            a_, w2_, h_, x_ = _as(a, dtype), _as(w2, dtype), _as(h, dtype), _as(x, dtype)
            grad_h = torch.ops.aten.leaky_relu_backward(grad_o.mm(w2_), h_, _LEAKY_SLOPE, False)
            grads[1] = grad_h.t().mm(x_)
            grads[2] = grad_h.sum(dim=0)
            grads[3] = grad_o.t().mm(a_)
            grads[4] = grad_o.sum(dim=0)
        return tuple(grads)
