"""PyTorch eager peer of bench/image_throughput.cc: the same three image models, read from the
same shipped configs, layer for layer and parameter for parameter, trained with the same step,
random inputs, median step time, peak RSS (ru_maxrss) and the RSS before the model was built
(the interpreter and torch's libraries). Prints one JSON line.

--model ddpm: models/ddpm's U-Net (configs/ddpm_mnist_cpu.toml): sinusoidal time embedding of
  base_channels (sin | cos, f_i = 10000^(-i / (half - 1))) -> Linear -> SiLU -> Linear; conv_in;
  per level num_res_blocks ResBlocks (GroupNorm, SiLU, 3x3 conv, + projected SiLU(temb), GroupNorm,
  SiLU, dropout, 3x3 conv; 1x1 skip when channels change), self-attention (GroupNorm, per-position
  Linear C -> 3C, softmax attention, Linear C -> C, residual) at the lowest level, a stride-2 3x3
  conv down between levels; middle ResBlock, attention, ResBlock; up path with num_res_blocks + 1
  ResBlocks per level on [h | skip] concatenations, nearest 2x upsampling + 3x3 conv between
  levels; GroupNorm, SiLU, 3x3 conv out. Step of `starling train`: epsilon MSE at a uniform t,
  clip_grad_norm, the config's optimizer (AdamW or SGD, decay on matrices only), EMA update.
--model cnn / 2nn: the MNIST CNN and 2NN of configs/fed_mnist_{cnn,2nn}_iid.toml, the federated
  client's local step: cross-entropy, plain SGD at [local] learning_rate.
--device cuda: the same on a GPU (batches drawn on the host and moved untimed, each timed step
  synchronized), fp32 with TF32 off for convolutions and matmuls as ours (--tf32 allows it, the
  PyTorch default for cuDNN convolutions); peak_device_mb from torch.cuda.max_memory_allocated.
"""
import argparse
import copy
import json
import math
import resource
import statistics
import time
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F


def timestep_embedding(t, dim, max_period=10000.0):
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64)
    f = torch.exp(-math.log(max_period) * i / (half - 1)) if half > 1 else torch.ones(1)
    a = t.double()[:, None] * f[None]
    return torch.cat([a.sin(), a.cos()], 1).float()


def linear(i, o):
    """Our nn::Linear: weights N(0, 0.02^2), bias zero."""
    m = nn.Linear(i, o)
    nn.init.normal_(m.weight, std=0.02)
    nn.init.zeros_(m.bias)
    return m


def zero(m):
    nn.init.zeros_(m.weight)
    nn.init.zeros_(m.bias)
    return m


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim, groups, dropout):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.temb_proj = linear(tdim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = zero(nn.Conv2d(cout, cout, 3, 1, 1))
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None
        self.dropout = dropout

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb))[:, :, None, None]
        h = F.dropout(F.silu(self.norm2(h)), self.dropout, self.training)
        return (self.skip(x) if self.skip is not None else x) + self.conv2(h)


class AttnBlock(nn.Module):
    def __init__(self, c, groups, heads):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c)
        self.qkv = linear(c, 3 * c)
        self.proj = linear(c, c)
        nn.init.zeros_(self.proj.weight)
        self.heads = heads

    def forward(self, x):
        b, c, h, w = x.shape
        seq = self.norm(x).reshape(b, c, h * w).transpose(1, 2)  # (B, HW, C)
        q, k, v = (z.reshape(b, h * w, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(seq).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c)
        return x + self.proj(y).transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, d):
        super().__init__()
        base, mult, nres = d["base_channels"], d["channel_mult"], d["num_res_blocks"]
        groups, heads, drop = d["groups"], d["attention_heads"], d["dropout"]
        td = 4 * base
        self.base = base
        self.temb = nn.Sequential(linear(base, td), nn.SiLU(), linear(td, td))
        self.conv_in = nn.Conv2d(d["image_channels"], base, 3, 1, 1)
        skip_ch, ch = [base], base
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        for lvl, m in enumerate(mult):
            out, attn = base * m, d["attention"] and lvl == len(mult) - 1
            stages = nn.ModuleList()
            for _ in range(nres):
                stages.append(nn.ModuleList([ResBlock(ch, out, td, groups, drop)]
                                            + ([AttnBlock(out, groups, heads)] if attn else [])))
                ch = out
                skip_ch.append(ch)
            self.down.append(stages)
            if lvl + 1 < len(mult):
                self.downsample.append(nn.Conv2d(ch, ch, 3, 2, 1))
                skip_ch.append(ch)
        self.mid1 = ResBlock(ch, ch, td, groups, drop)
        self.mid_attn = AttnBlock(ch, groups, heads) if d["attention"] else None
        self.mid2 = ResBlock(ch, ch, td, groups, drop)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for lvl in reversed(range(len(mult))):
            out, attn = base * mult[lvl], d["attention"] and lvl == len(mult) - 1
            stages = nn.ModuleList()
            for _ in range(nres + 1):
                stages.append(nn.ModuleList([ResBlock(ch + skip_ch.pop(), out, td, groups, drop)]
                                            + ([AttnBlock(out, groups, heads)] if attn else [])))
                ch = out
            self.up.append(stages)
            if lvl > 0:
                self.upsample.append(nn.Conv2d(ch, ch, 3, 1, 1))
        self.norm_out = nn.GroupNorm(groups, ch)
        self.conv_out = zero(nn.Conv2d(ch, d["image_channels"], 3, 1, 1))

    def forward(self, x, t):
        temb = self.temb(timestep_embedding(t, self.base))
        h = self.conv_in(x)
        skips = [h]
        for lvl, stages in enumerate(self.down):
            for stage in stages:
                h = stage[0](h, temb)
                if len(stage) > 1:
                    h = stage[1](h)
                skips.append(h)
            if lvl < len(self.downsample):
                h = self.downsample[lvl](h)
                skips.append(h)
        h = self.mid2(self.mid_attn(self.mid1(h, temb)) if self.mid_attn else self.mid1(h, temb),
                      temb)
        for lvl, stages in enumerate(self.up):
            for stage in stages:
                h = stage[0](torch.cat([h, skips.pop()], 1), temb)
                if len(stage) > 1:
                    h = stage[1](h)
            if lvl < len(self.upsample):
                h = self.upsample[lvl](F.interpolate(h, scale_factor=2, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(h)))


class Cnn(nn.Module):
    def __init__(self, c1, c2, fc, side=28, classes=10):
        super().__init__()
        self.side = side
        self.conv1 = nn.Conv2d(1, c1, 5, 1, 2)
        self.conv2 = nn.Conv2d(c1, c2, 5, 1, 2)
        self.fc1 = nn.Linear(c2 * (side // 4) ** 2, fc)
        self.fc2 = nn.Linear(fc, classes)

    def forward(self, x):
        h = x.view(x.shape[0], 1, self.side, self.side)
        h = F.max_pool2d(F.relu(self.conv1(h)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class Mlp(nn.Module):
    def __init__(self, hidden, n_in=784, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def rss_mb(field="VmRSS:"):
    """A line of /proc/self/status in MiB (0 if absent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def init_classifier(model, m):
    """[model] init as edge_client::init_spec: TORCH (PyTorch's own), GLOROT, TRUNCATED_NORMAL."""
    kind = m.get("init", "TORCH").upper()
    for layer in model.modules():
        if not isinstance(layer, (nn.Linear, nn.Conv2d)) or kind == "TORCH":
            continue
        if kind == "GLOROT":
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        elif kind == "TRUNCATED_NORMAL":
            std = m.get("init_std", 0.1)
            nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.constant_(layer.bias, m.get("init_bias", 0.1))
        else:
            raise SystemExit(f"unknown [model] init {kind!r}")


def ddpm_bench(cfg, batch, gen, dev="cpu"):
    # Absent keys take core/wire/config.proto's defaults, as ours does.
    d = {"image_size": 28, "image_channels": 1, "base_channels": 32, "channel_mult": [1, 2, 2],
         "num_res_blocks": 1, "groups": 8, "attention": True, "attention_heads": 1,
         "dropout": 0.0, "timesteps": 1000, "schedule": "linear", "beta_start": 1e-4,
         "beta_end": 0.02, "cosine_s": 0.008, "ema_decay": 0.999} | cfg.get("ddpm", {})
    d["channel_mult"] = d["channel_mult"] or [1, 2, 2]
    tc = {"batch_size": 12, "optimizer": "adamw", "learning_rate": 1e-3, "weight_decay": 0.1,
          "beta1": 0.9, "beta2": 0.99, "momentum": 0.9, "grad_clip": 1.0,
          "seed": 1337} | cfg.get("train", {})
    torch.manual_seed(tc["seed"])
    n = d["timesteps"]
    if d["schedule"].lower() == "linear":
        betas = torch.linspace(d["beta_start"], d["beta_end"], n, dtype=torch.float64)
    else:
        s = d["cosine_s"]
        u = torch.arange(n + 1, dtype=torch.float64) / n
        f = torch.cos((u + s) / (1 + s) * math.pi / 2) ** 2
        betas = torch.clamp(1 - f[1:] / f[:-1], max=0.999)
    alpha_bar = torch.cumprod(1 - betas, 0)
    net = UNet(d).to(dev)
    ema = copy.deepcopy(net).requires_grad_(False) if d["ema_decay"] > 0 else None
    params = list(net.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if tc["optimizer"].lower() == "sgd":
        opt = torch.optim.SGD(groups, lr=tc["learning_rate"], momentum=tc["momentum"])
    else:
        opt = torch.optim.AdamW(groups, lr=tc["learning_rate"], betas=(tc["beta1"], tc["beta2"]),
                                eps=1e-8)
    side, ch = d["image_size"], d["image_channels"]
    batch = batch or tc["batch_size"]
    state = {"it": 0}

    def draw():
        return torch.rand(batch, ch, side, side, generator=gen) * 2 - 1

    def step(x0):
        t = torch.randint(0, n, (batch,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        ab = alpha_bar[t]
        # x_t on the host, as ours; then the batch moves (part of the step, as ours).
        xt = (ab.sqrt().float()[:, None, None, None] * x0
              + (1 - ab).sqrt().float()[:, None, None, None] * noise)
        xt, noise, tf = xt.to(dev), noise.to(dev), t.float().to(dev)
        loss = F.mse_loss(net(xt, tf), noise)
        v = loss.item()
        loss.backward()
        if tc["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, tc["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ema is not None:
            it = state["it"]
            decay = min(d["ema_decay"], (1 + it) / (10 + it))
            with torch.no_grad():
                for e, p in zip(ema.parameters(), params):
                    e.lerp_(p, 1 - decay)
        state["it"] += 1
        if dev != "cpu":
            torch.cuda.synchronize()
        return v

    def sample(num, steps):
        # The ancestral sampler of models/ddpm/diffusion.cc on the respaced chain, from the EMA
        # weights when there are any: x0 predicted and clipped, the posterior of the one-step chain.
        m = ema if ema is not None else net
        m.eval()
        seq = sorted({round(i * (n - 1) / (steps - 1)) for i in range(steps)}) if steps > 1 else [n - 1]
        with torch.no_grad():
            x = torch.randn(num, ch, side, side, generator=gen).to(dev)
            for i in reversed(range(len(seq))):
                t = seq[i]
                ab = float(alpha_bar[t])
                ab_prev = float(alpha_bar[seq[i - 1]]) if i > 0 else 1.0
                e = m(x, torch.full((num,), float(t), device=dev))
                x0 = ((x - math.sqrt(1 - ab) * e) / math.sqrt(ab)).clamp(-1, 1)
                beta = 1 - ab / ab_prev
                c0 = math.sqrt(ab_prev) * beta / (1 - ab)
                ct = math.sqrt(1 - beta) * (1 - ab_prev) / (1 - ab)
                x = c0 * x0 + ct * x
                if i > 0:
                    x = x + math.sqrt(beta * (1 - ab_prev) / (1 - ab)) * torch.randn_like(x)
            x = x.clamp(-1, 1)
            if dev != "cpu":
                torch.cuda.synchronize()
        m.train()
        return x

    step.sample = sample
    return net, batch, draw, step


def classifier_bench(cfg, kind, batch, gen, dev="cpu"):
    m = cfg.get("model", {})
    arch = m.get("arch", "MLP").upper()
    if arch != ("CNN" if kind == "cnn" else "MLP"):
        raise SystemExit(f"[model] arch is {arch}, not the {kind}'s")
    torch.manual_seed(m.get("seed", 1))
    if kind == "cnn":
        model = Cnn(m.get("cnn_channels1", 32), m.get("cnn_channels2", 64), m.get("cnn_fc", 512))
    else:
        model = Mlp(m.get("hidden", 200))
    init_classifier(model, m)
    model = model.to(dev)
    local = cfg.get("local", {})
    batch = batch or local.get("batch_size", 10)
    opt = torch.optim.SGD(model.parameters(), lr=local.get("learning_rate", 0.1))

    def draw():
        return (torch.rand(batch, 784, generator=gen).to(dev),
                torch.randint(0, 10, (batch,), generator=gen).to(dev))

    def step(xy):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xy[0]), xy[1])
        v = loss.item()
        loss.backward()
        opt.step()
        if dev != "cpu":
            torch.cuda.synchronize()
        return v

    return model, batch, draw, step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="ddpm", choices=["ddpm", "cnn", "2nn"])
    p.add_argument("--config", help="default: the model's shipped config")
    p.add_argument("--batch", type=int, default=0, help="0: the config's batch size")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="0: PyTorch's default")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in convolutions and matmuls")
    p.add_argument("--sample", type=int, default=0,
                   help="DDPM: also time sampling this many images (after the training steps)")
    p.add_argument("--sample-steps", type=int, default=100, help="DDPM: steps of --sample")
    a = p.parse_args()
    dev = a.device
    if dev != "cpu":
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.cuda.reset_peak_memory_stats()
    if a.steps < 1 or a.warmup < 0 or a.batch < 0:
        p.error("--steps must be positive, --warmup and --batch non-negative")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    path = a.config or ("configs/ddpm_mnist_cpu.toml" if a.model == "ddpm"
                        else f"configs/fed_mnist_{a.model}_iid.toml")
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    start_rss = rss_mb()  # before the model: the interpreter and torch's libraries
    gen = torch.Generator().manual_seed(1)
    if a.model == "ddpm":
        model, batch, draw, step = ddpm_bench(cfg, a.batch, gen, dev)
    else:
        model, batch, draw, step = classifier_bench(cfg, a.model, a.batch, gen, dev)
    model.train()
    times, loss = [], None
    for s in range(a.warmup + a.steps):
        inputs = draw()
        t0 = time.perf_counter()
        loss = step(inputs)
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    med = statistics.median_high(times)  # sorted[n // 2], as ours
    sample_s = None
    if a.sample > 0 and a.model == "ddpm":
        t0 = time.perf_counter()
        step.sample(a.sample, a.sample_steps)
        sample_s = time.perf_counter() - t0
    print(json.dumps({
        "engine": "pytorch eager", "torch": torch.__version__, "model": a.model,
        "threads": torch.get_num_threads(), "batch": batch, "ms_per_step": med * 1e3,
        "samples_per_s": batch / med, "params": sum(q.numel() for q in model.parameters()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "start_rss_mb": start_rss, "loss": loss, "device": dev,
        "tf32": bool(a.tf32) if dev != "cpu" else False,
        "sample_images": a.sample if sample_s is not None else 0, "sample_steps": a.sample_steps,
        "sample_s": sample_s,
        "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20 if dev != "cpu" else 0.0}))


if __name__ == "__main__":
    main()
