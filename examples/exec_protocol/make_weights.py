"""Writes linreg.py's initial model (zeros) as safetensors: python3 make_weights.py OUT."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import starling_exec as se  # noqa: E402

se.write_safetensors(sys.argv[1], {"linear.weight": ([4], [0.0] * 4), "linear.bias": ([1], [0.0])})
