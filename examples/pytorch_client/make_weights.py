"""Writes train.py's initial model (PyTorch's default init, seeded) as safetensors:
python3 make_weights.py OUT [HIDDEN]."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "exec_protocol"))
import starling_exec as se  # noqa: E402
from train import Net  # noqa: E402

torch.manual_seed(1)
model = Net(int(sys.argv[2]) if len(sys.argv) > 2 else 64)
se.write_safetensors(sys.argv[1], {name: (list(t.shape), t.reshape(-1).tolist())
                                   for name, t in model.state_dict().items()})
