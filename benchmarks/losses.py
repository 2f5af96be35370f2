"""Training-step cost of each calibration loss against plain cross-entropy, on the same model and batch.

One step = forward (with the head's input captured for FeDLaS) + loss + backward + AdamW step.
All losses run in one process on identically initialised copies of the model; timing rounds are
interleaved (every loss once per round, the order rotated each round) and the median round is
reported, so load drift on a shared machine hits every loss alike. Peak memory: on CUDA the
allocator's peak during one step above what was resident before it (parameters and optimizer
states of all copies), on CPU torch's ``MemTracker`` peak of one step.

    python benchmarks/losses.py                       # CPU, tiny ViT, batch 32
    python benchmarks/losses.py --device cuda --model vit-s16 --batch 128 --bf16
"""

from __future__ import annotations

import argparse
import copy
import gc
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import ViTConfig, ViTForImageClassification

from hf_calibration._core.features import capture_features
from hf_calibration.losses import get_loss

MODELS = {
    # name: (ViTConfig kwargs, num_labels)
    "tiny": (
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
        ),
        10,
    ),
    "cifar": (
        dict(
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=32,
            patch_size=4,
        ),
        100,
    ),
    "vit-s16": (
        dict(
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=224,
            patch_size=16,
        ),
        100,
    ),
}

# (row name, loss name or None for bare F.cross_entropy, kwargs)
ROWS = [
    ("F.cross_entropy (baseline)", None, {}),
    ("CrossEntropyLoss", "ce", {}),
    ("LabelSmoothingLoss", "ls", {}),
    ("MbLSLoss", "mbls", {}),
    ("FocalLoss", "focal", {}),
    ("FLSD53Loss", "flsd53", {}),
    ("FeDLaSLoss ls", "fedlas_ls", {}),
    ("FeDLaSLoss mbls", "fedlas_mbls", {}),
    ("FeDLaSLoss ls, validate_args=False", "fedlas_ls", {"validate_args": False}),
]


class Runner:
    """One model copy, its optimizer and one loss; ``step()`` runs one full training step."""

    def __init__(self, base_model, loss, pixel_values, labels, bf16):
        self.model = copy.deepcopy(base_model).train()
        self.loss = loss
        params = list(self.model.parameters())
        if loss is not None:
            loss.to(pixel_values.device).train()
            params += list(loss.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=1e-4)
        self.x, self.y, self.bf16 = pixel_values, labels, bf16
        self.needs_features = loss is not None and loss.requires_features
        self.capture = capture_features(self.model) if self.needs_features else None
        self.cap = self.capture.__enter__() if self.capture is not None else None

    def step(self):
        with torch.autocast(self.x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(pixel_values=self.x)
            if self.loss is None:
                value = F.cross_entropy(out.logits.float(), self.y)
            elif self.needs_features:
                value = self.loss(out, self.y, features=self.cap.pop())
            else:
                value = self.loss(out, self.y)
        value.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved_steps(runners, steps):
    """CPU: every loss takes one step in turn, ``steps`` times; the median per-step time of each loss."""
    per_step = {name: [] for name in runners}
    for _ in range(steps):
        for name, runner in runners.items():
            t0 = time.perf_counter()
            runner.step()
            per_step[name].append(time.perf_counter() - t0)
    return per_step


def time_rounds(runners, device, steps, rounds):
    """CUDA: rounds of ``steps`` unsynchronised steps per loss (host syncs inside a loss show up), median round."""
    per_round = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                runners[name].step()
            _sync(device)
            per_round[name].append((time.perf_counter() - t0) / steps)
    return per_round


def peak_step_memory(runner, device):
    if device.type == "cuda":
        _sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(runner.model, runner.optimizer)
    with tracker:
        runner.step()
    return tracker.get_tracker_snapshot("peak")[device]["Total"]


def _top_level_aten_ops(prof):
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )


def step_op_count(runner):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.step()
    return _top_level_aten_ops(prof)


def _loss_value(loss, z, labels, features):
    """The loss on logits ``z`` (``F.cross_entropy`` for ``loss=None``), features passed where it needs them."""
    if loss is None:
        return F.cross_entropy(z.float(), labels)
    return loss(z, labels, features=features) if loss.requires_features else loss(z, labels)


def loss_op_count(loss, logits, labels, features):
    """Top-level aten ops dispatched by the loss's forward and backward alone (what costs host time per step)."""
    from torch.profiler import ProfilerActivity, profile

    z = logits.detach().clone().requires_grad_(True)

    def run():
        _loss_value(loss, z, labels, features).backward()

    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return _top_level_aten_ops(prof)


def loss_host_time(loss, logits, labels, features, device, calls=50, rounds=15):
    """Median wall time of the loss's forward + backward on a small batch (8 rows), in seconds.

    With so few rows the kernels are trivial, so this is the host's cost of the loss: Python, dispatch,
    autograd and (on CUDA) kernel launches, i.e. what the loss adds to a host-bound step.
    """
    z = logits.detach().clone().requires_grad_(True)
    params = [] if loss is None else list(loss.parameters())

    def run():
        _loss_value(loss, z, labels, features).backward()
        z.grad = None
        for p in params:
            p.grad = None

    for _ in range(calls):
        run()
    per_round = []
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        _sync(device)
        per_round.append((time.perf_counter() - t0) / calls)
    return statistics.median(per_round)


def machine_line(device):
    if device.type == "cuda":
        return (
            f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, transformers {transformers.__version__}"
        )
    return (
        f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for forward and loss")
    p.add_argument("--steps", type=int, default=10, help="timed steps per loss per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "losses.md"))
    p.add_argument(
        "--append", action="store_true", help="append this machine's section to --out instead of replacing it"
    )
    args = p.parse_args(argv)

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg_kwargs, num_labels = MODELS[args.model]
    base = ViTForImageClassification(ViTConfig(num_labels=num_labels, **cfg_kwargs)).to(device)
    size = cfg_kwargs["image_size"]
    x = torch.randn(args.batch, 3, size, size, device=device)
    y = torch.randint(0, num_labels, (args.batch,), device=device)

    runners = {}
    for name, loss_name, kwargs in ROWS:
        if loss_name is None:
            loss = None
        else:
            if loss_name.startswith("fedlas"):
                kwargs = {"num_classes": num_labels, **kwargs}
            loss = get_loss(loss_name, **kwargs)
        runners[name] = Runner(base, loss, x, y, args.bf16)
    for runner in runners.values():
        for _ in range(args.warmup):
            runner.step()
    gc.collect()
    gc.disable()  # a collection inside one loss's round would be charged to that loss
    if device.type == "cuda":
        times = time_rounds(runners, device, args.steps, args.rounds)
        how = (
            f"{args.rounds} interleaved rounds of {args.steps} steps per loss (order rotated each round), "
            "no synchronisation inside a round; time = median round, ratio = median of per-round ratios"
        )
    else:
        times = time_interleaved_steps(runners, args.steps * args.rounds)
        how = (
            f"{args.steps * args.rounds} steps per loss, losses interleaved step by step; "
            "time = median step, ratio = median of per-step ratios"
        )
    gc.enable()
    memory = {name: peak_step_memory(runner, device) for name, runner in runners.items()}
    with torch.no_grad():
        with capture_features(base) as cap:
            logits = base(pixel_values=x[:8]).logits
            features = cap.pop()
    step_ops = step_op_count(runners[ROWS[0][0]])
    ops = {name: loss_op_count(runner.loss, logits, y[:8], features) for name, runner in runners.items()}
    host = {name: loss_host_time(runner.loss, logits, y[:8], features, device) for name, runner in runners.items()}

    baseline = ROWS[0][0]
    # ratio: median over rounds (CPU: steps) of this loss's time over the baseline's time in the same round,
    # which cancels drift in the machine's speed; spread: the interquartile range of those ratios
    ratios = {}
    for name in runners:
        r = sorted(a / b for a, b in zip(times[name], times[baseline]))
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        ratios[name] = (statistics.median(r), q[0], q[2])
    times = {name: statistics.median(v) for name, v in times.items()}
    n_params = sum(t.numel() for t in base.parameters())
    cmd = "python benchmarks/losses.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"### {args.model} ViT ({n_params / 1e6:.2f} M params), batch {args.batch}, {args.device}"
        + (", bf16 autocast" if args.bf16 else ""),
        "",
        f"- machine: {machine_line(device)}",
        f"- command: `{cmd.strip()}`",
        f"- step = forward + loss + backward + AdamW step; {how}",
        f"- a whole baseline step dispatches {step_ops} top-level aten ops; the last two columns are the loss's own: "
        "top-level aten ops of one forward + backward, and its host time (median µs of forward + backward on "
        "8 rows, where the kernels are trivial: Python, dispatch, autograd and launches)",
        "",
        "| loss | step time (ms) | time ratio vs CE (IQR) | peak step memory (MiB) | memory ratio vs CE "
        "| aten ops, loss fwd+bwd | host µs, loss fwd+bwd |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in runners:
        lines.append(
            f"| {name} | {times[name] * 1e3:.2f} | {ratios[name][0]:.3f} ({ratios[name][1]:.3f}–{ratios[name][2]:.3f}) | "
            f"{memory[name] / 2**20:.2f} | {memory[name] / memory[baseline]:.3f} | {ops[name]} | {host[name] * 1e6:.0f} |"
        )
    section = "\n".join(lines) + "\n"
    print(section)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.append and out.exists():
        out.write_text(out.read_text() + "\n" + section)
    else:
        out.write_text("## Losses: training-step overhead vs cross-entropy\n\n" + section)


if __name__ == "__main__":
    main()
