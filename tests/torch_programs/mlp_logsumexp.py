"""The program of ../shared/traces/torch-profiler-cpu-mlp-train.json.gz, reconstructed.

A 3-layer MLP (1024 -> 4096 -> 4096 -> 10, GELU), AdamW, five steps on fresh 128 x 1024 batches,
loss ``logsumexp(-1).mean()``. The shared trace's script is not there; this one was rebuilt from
its sizes and order, and run on the CPU under torch.profiler (torch 2.13.0+cpu) it gives the
shared trace's 1,098 [memory] events, sizes and order, exactly (tests/test_torch_meta.py).
"""
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"


def train():
    with torch.device(device):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                              nn.Linear(4096, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    for _step in range(5):
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(128, 1024, device=device)
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


train()
