#!/usr/bin/env python3
"""The PyTorch + peft side of bench/lora_bench.cc: LoRA training steps on a GPT-2 124M.

Builds GPT2LMHeadModel(GPT2Config()) (the 124M shape: vocab 50257, 1024 positions, 12 layers,
12 heads, n_embd 768, biases, gelu_new, tied head) with random weights in float32 and dropout 0,
wraps it with peft LoRA on c_attn, c_proj (attn.c_proj and mlp.c_proj both match) and c_fc,
and runs --steps steps of AdamW on random token ids: loss = model(ids, labels=ids).loss,
backward, clip_grad_norm_(1.0), step, zero_grad.

Prints one JSON line: peak_rss_mib (ru_maxrss), step_s (mean seconds per step after the first;
the first step's time when --steps is 1), trainable, total, torch, peft; and, to see where the
memory goes, "phases": [name, VmRSS MiB, VmHWM MiB] read from /proc/self/status after each
phase of the run (startup with the imports, model built, LoRA + optimizer, step 1 forward / backward / update).
"""
import argparse
import json
import os
import resource
import sys
import time
import warnings


def proc_status_mib(key):
    """VmRSS / VmHWM of this process in MiB (-1 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return -1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("peft_lora_step: --steps must be at least 1")

    phases = []

    def phase(name):
        phases.append([name, round(proc_status_mib("VmRSS"), 1), round(proc_status_mib("VmHWM"), 1)])

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import peft
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    phase("startup")

    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to(torch.float32)
    phase("model built")

    lora = LoraConfig(
        r=args.rank,
        lora_alpha=args.alpha,
        lora_dropout=0.0,
        target_modules=["c_attn", "c_proj", "c_fc"],
        fan_in_fan_out=True,
    )
    model = get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    total = sum(p.numel() for p in model.parameters())  # tied head counted once
    opt = torch.optim.AdamW(params, lr=args.lr)
    phase("LoRA applied + optimizer")

    times = []
    for step in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        if step == 0:
            phase("step 1 forward")
        loss.backward()
        if step == 0:
            phase("step 1 backward")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        if step == 0:
            phase("step 1 optimizer")
        if not torch.isfinite(loss):
            sys.exit(f"peft_lora_step: loss {loss.item()} at step {step}")
        times.append(time.perf_counter() - t0)
    phase("after all steps")

    timed = times[1:] if len(times) > 1 else times
    print(
        json.dumps(
            {
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "step_s": sum(timed) / len(timed),
                "trainable": trainable,
                "total": total,
                "torch": torch.__version__,
                "peft": peft.__version__,
                "threads": torch.get_num_threads(),
                "loss": loss.item(),
                "phases": phases,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
