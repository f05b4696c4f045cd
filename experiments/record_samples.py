"""Record the bundled real traces: two small CPU PyTorch workloads under the PyTorch profiler.

    python -m experiments.record_samples [--out traces/data]

Needs torch (CPU build is enough; it is not a project dependency). Writes

- ``sample-torch-cpu-mlp.npz`` — 5 training steps (forward, backward, Adam) of a 3-layer MLP;
- ``sample-torch-cpu-transformer.npz`` — inference of a 2-layer transformer encoder on
  batches of varying sequence length;

each recorded with :func:`allocsim.traces.record.record_torch` (CPU allocations, ops as tags). The
model is built inside the recorded function so that every buffer is seen from its allocation;
seeds and a single intra-op thread keep the recordings close to reproducible (the profiler's
times still vary from run to run). Metadata names the recorder, torch version and this script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SCRIPT = "experiments/record_samples.py"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "traces" / "data"


def mlp_training(steps: int = 5, batch: int = 64) -> None:
    """A 3-layer MLP (256 -> 512 -> 512 -> 10) trained with Adam for ``steps`` steps."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(batch, 256)
        y = torch.randint(0, 10, (batch,))
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def transformer_inference(lengths: tuple[int, ...] = (16, 48, 32, 96, 64, 128, 24),
                          batch: int = 4) -> None:
    """A 2-layer transformer encoder (d_model 128, 4 heads) run on batches of ``lengths``."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
                                       dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    with torch.inference_mode():
        for length in lengths:
            encoder(torch.randn(batch, length, 128)).sum().item()


WORKLOADS: dict[str, tuple[Any, str]] = {
    "sample-torch-cpu-mlp": (mlp_training, "5 Adam training steps of a 3-layer MLP "
                                           "(256-512-512-10, batch 64) on CPU"),
    "sample-torch-cpu-transformer": (transformer_inference,
                                     "inference of a 2-layer transformer encoder (d_model 128, "
                                     "4 heads, batch 4) at sequence lengths "
                                     "16, 48, 32, 96, 64, 128, 24 on CPU"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write to")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("record_samples: needs torch (pip install torch)", file=sys.stderr)
        return 1
    from allocsim.traces.record import record_torch

    torch.set_num_threads(1)
    for name, (workload, description) in WORKLOADS.items():
        torch.manual_seed(0)
        output = args.out / f"{name}.npz"
        trace = record_torch(workload, output=output, device="cpu",
                             metadata={"name": name, "source": f"traces/data/{name}.npz",
                                       "script": SCRIPT, "workload": description,
                                       "function": f"experiments.record_samples."
                                                   f"{workload.__name__}"})
        peak, _ = trace.peak_live()
        print(f"{output}: {len(trace)} events, peak live {peak:,} bytes, "
              f"{output.stat().st_size:,} bytes on disk")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
