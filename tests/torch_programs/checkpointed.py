"""An MLP stack with torch.utils.checkpoint (non-reentrant) around each block; two Adam steps.
argv: width depth batch."""
import sys

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

width, depth, batch = ([int(a) for a in sys.argv[1:4]] if len(sys.argv) >= 4 else [64, 4, 8])
device = "cuda" if torch.cuda.is_available() else "cpu"
blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width)) for _ in range(depth)).to(device)
optimizer = torch.optim.Adam(blocks.parameters(), lr=1e-3)
for _step in range(2):
    x = torch.randn(batch, width, device=device, requires_grad=True)
    for block in blocks:
        x = x + checkpoint(block, x, use_reentrant=False)
    x.pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
