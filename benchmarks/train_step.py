"""One bi-encoder training step, timed by attention kernel, precision and attention dropout.

What `retr train`'s choice of attention implementation rests on (``train/common.py: model_kwargs``): the bundled
MiniLM, in training mode, forward and backward over a batch like the trainer's GradCache mini-batches (queries,
positives and negatives of 16 pairs: 48 texts by default, at 256 tokens, padded to random lengths so padding masks
are in play), then an AdamW step. Each setting runs in its own process, one after the other; the median of the
timed steps after warm-up is reported. This VM's speed moves by up to 1.5x from one process to the next, so the
settings run in turn ``--repeat`` times and each reports the median over its processes.

    python benchmarks/train_step.py [--settings eager:bf16:0,sdpa:bf16:0,eager:bf16:0.1,sdpa:bf16:0.1]
        [--repeat 3] [--batch 48] [--length 256] [--steps 6] [--warmup 2] [--out benchmarks/results/train-step.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time


def step_times(impl: str, precision: str, dropout: float, batch: int, length: int, steps: int) -> list[float]:
    """Seconds per training step, in this process."""
    import torch
    from transformers import AutoModel

    from retr.retrieval.models import bundled_model_path

    torch.manual_seed(0)
    model = AutoModel.from_pretrained(str(bundled_model_path()), attn_implementation=impl,
                                      attention_probs_dropout_prob=dropout)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1000, 20000, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(batch):
        mask[i, int(torch.randint(length // 4, length, (1,))):] = 0
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            loss = (hidden.float() * mask[..., None]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", default="eager:bf16:0,sdpa:bf16:0,eager:bf16:0.1,sdpa:bf16:0.1",
                   help="comma-separated IMPL:PRECISION:ATTENTION_DROPOUT")
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3, help="processes per setting, run in turn with the others")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/train-step.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        impl, precision, dropout = args.child.split(":")
        print(json.dumps(step_times(impl, precision, float(dropout), args.batch, args.length, args.steps)))
        return 0

    from common import command_line, run_child, write_result

    from retr.retrieval.backends.platform import this_platform

    settings = []
    for setting in args.settings.split(","):
        if setting.split(":")[1] == "bf16" and not this_platform().bf16:
            print(f"{setting}: skipped (no native bf16 on this CPU)", file=sys.stderr)
        else:
            settings.append(setting)
    medians: dict[str, list[float]] = {s: [] for s in settings}
    for _ in range(args.repeat):
        for setting in settings:
            times = run_child(__file__, [setting, "--batch", str(args.batch), "--length", str(args.length),
                                         "--steps", str(args.steps)])
            medians[setting].append(statistics.median(times[args.warmup:]))
            print(f"{setting}: {medians[setting][-1]:.3f} s a step", file=sys.stderr)
    rows = []
    for setting, values in medians.items():
        impl, precision, dropout = setting.split(":")
        rows.append({"attention": impl, "precision": precision, "attention_dropout": float(dropout),
                     "median_s_per_process": values, "median_s": statistics.median(values)})
        print(f"{impl:6s} {precision:5s} attention dropout {dropout:4s}: {statistics.median(values):.3f} s a step "
              f"(median of {len(values)} processes)")
    result = {"command": command_line(), "cpu_kind": this_platform().kind, "cpu": platform.processor() or platform.machine(),
              "batch": args.batch, "length": args.length, "steps": args.steps, "warmup_steps": args.warmup,
              "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
