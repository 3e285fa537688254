"""PyTorch reference run of the CPU baby GPT on Tiny Shakespeare: nanoGPT's model and training
loop (same data split, batches, AdamW groups, warmup + cosine schedule, clipping, evaluation)
using bench/torch_gpt.py's model. Prints the val loss every eval_interval, to set beside
`starling train --config configs/gpt_char_cpu.toml`."""
import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from torch_gpt import GPT


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "../../shared/data/tinyshakespeare/input.txt"))
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-iters", type=int, default=200)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    text = open(a.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    B, T = 12, 64
    model = GPT(len(chars), T, 4, 4, 128)
    for name, prm in model.named_parameters():  # nanoGPT's init
        if prm.dim() >= 2:
            std = 0.02 / math.sqrt(2 * 4) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
            torch.nn.init.normal_(prm, 0.0, std)
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
    nodecay = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.99))

    def batch(split):
        d = train if split == "train" else val
        ix = torch.randint(len(d) - T, (B,))
        return torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix])

    def get_lr(it):
        if it < a.warmup:
            return a.lr * (it + 1) / (a.warmup + 1)
        if it > a.iters:
            return a.min_lr
        r = (it - a.warmup) / (a.iters - a.warmup)
        return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (a.lr - a.min_lr)

    @torch.no_grad()
    def evaluate():
        model.eval()
        out = {}
        for split in ("train", "val"):
            out[split] = sum(model(*batch(split)).item() for _ in range(a.eval_iters)) / a.eval_iters
        model.train()
        return out

    t0 = time.time()
    for it in range(a.iters + 1):
        if it % a.eval_interval == 0 or it == a.iters:
            l = evaluate()
            print(f"step {it}: train loss {l['train']:.4f}, val loss {l['val']:.4f}", flush=True)
        if it == a.iters:
            break
        for g in opt.param_groups:
            g["lr"] = get_lr(it)
        loss = model(*batch("train"))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
