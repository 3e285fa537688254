"""PyTorch peer of bench/train_throughput.cc (CPU) and bench/gpt_train_bench.cc (CUDA): the
same GPT (nanoGPT's model, tied head, exact GELU, pre-norm, biases with --bias), the same step
(forward + backward + clip + AdamW: foreach on CPU, fused on CUDA), random tokens, median step
time. --device cuda times with synchronization and reports peak memory
(torch.cuda.max_memory_allocated); --compile wraps the model in torch.compile (its compilation
runs in the warmup steps). fp32 (TF32 off, PyTorch's default for matmuls), or with --bf16
torch.autocast(bfloat16) around the forward (fp32 master weights, as the issue's bf16 runs).
--mdlm trains the masked diffusion LM of models/mdlm instead (the same trunk with bidirectional
attention, V + 1 embeddings with [MASK] = V, the SUBS loss: cross-entropy over the first V logits
at masked positions weighted 1/t, one stratified t per sequence, eps = 1e-3), the step of
`starling train` for model.arch = "mdlm". Prints one JSON line."""
import argparse
import contextlib
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h, bias=False, causal=True):
        super().__init__()
        self.h = h
        self.causal = causal
        self.ln_1 = nn.LayerNorm(c, bias=bias)
        self.c_attn = nn.Linear(c, 3 * c, bias=bias)
        self.c_proj = nn.Linear(c, c, bias=bias)
        self.ln_2 = nn.LayerNorm(c, bias=bias)
        self.c_fc = nn.Linear(c, 4 * c, bias=bias)
        self.mlp_proj = nn.Linear(4 * c, c, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.h, c // self.h).transpose(1, 2)
        k = k.view(b, t, self.h, c // self.h).transpose(1, 2)
        v = v.view(b, t, self.h, c // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, v, t, l, h, c, bias=False, causal=True):
        super().__init__()
        self.wte = nn.Embedding(v, c)
        self.wpe = nn.Embedding(t, c)
        self.blocks = nn.ModuleList([Block(c, h, bias, causal) for _ in range(l)])
        self.ln_f = nn.LayerNorm(c, bias=bias)
        # GPT-2's initialization, as ours (models/gpt): N(0, 0.02) weights, zero biases. PyTorch's
        # default N(0, 1) embeddings make the tied head's logits ~sqrt(C) wide (loss ~100 at
        # GPT-2's shape); the timing is the same either way.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def logits(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class MDLM(GPT):
    """Absorbing-state masked diffusion (Sahoo et al. 2024) on the GPT trunk: V + 1 embeddings,
    bidirectional attention; the loss of models/mdlm Mdlm::loss (Bernoulli masks)."""

    def __init__(self, v, t, l, h, c, bias=False, eps=1e-3):
        super().__init__(v + 1, t, l, h, c, bias, causal=False)
        self.v = v
        self.eps = eps

    def forward(self, x0, _targets=None):
        b, t = x0.shape
        # One stratified time per sequence; each token masked with probability 1 - alpha(t).
        u = (torch.arange(b, device=x0.device) + torch.rand(b, device=x0.device)) / b
        tt = self.eps + (1 - self.eps) * u
        move = (1 - self.eps) * tt
        masked = torch.rand(b, t, device=x0.device) < move[:, None]
        xt = torch.where(masked, torch.full_like(x0, self.v), x0)
        logits = self.logits(xt)[..., : self.v]  # SUBS: no [MASK] logit
        ce = F.cross_entropy(logits.reshape(-1, self.v).float(), x0.reshape(-1),
                             reduction="none").view(b, t)
        return (ce * masked / tt[:, None]).sum() / (b * t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm")
    p.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16")
    p.add_argument("--mdlm", action="store_true", help="the masked diffusion LM's step")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    cls = MDLM if a.mdlm else GPT
    model = cls(a.vocab, a.block, a.layers, a.heads, a.embd, a.bias).to(a.device)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    times = []
    loss = None
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.block), device=a.device)
        y = torch.randint(0, a.vocab, (a.batch, a.block), device=a.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with (torch.autocast(a.device, dtype=torch.bfloat16) if a.bf16
              else contextlib.nullcontext()):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()  # waits for the step, as ours reads its loss
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    out = {"engine": "pytorch " + torch.__version__ + (" compile" if a.compile else " eager")
           + (" bf16" if a.bf16 else ""), "model": "mdlm" if a.mdlm else "gpt",
           "device": a.device, "threads": torch.get_num_threads(),
           "ms_per_step": med * 1e3, "tokens_per_s": a.batch * a.block / med,
           "params": sum(p.numel() for p in model.parameters()), "loss": loss_v}
    if cuda:
        out["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    else:  # peak RSS of the process, as bench/train_throughput.cc reports its own (VmHWM)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
