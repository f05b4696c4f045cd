"""Greedy-free decoding with a growing KV cache (torch.cat per step), under no_grad.
argv: width heads steps."""
import sys

import torch
import torch.nn.functional as F

width, heads, steps = ([int(a) for a in sys.argv[1:4]] if len(sys.argv) >= 4 else [64, 4, 12])
device = "cuda" if torch.cuda.is_available() else "cpu"
head_dim = width // heads
qkv = torch.nn.Linear(width, 3 * width).to(device)
out = torch.nn.Linear(width, width).to(device)
with torch.no_grad():
    x = torch.randn(1, 8, width, device=device)
    q, k, v = qkv(x).split(width, dim=-1)
    cache_k = k.view(1, 8, heads, head_dim).transpose(1, 2)
    cache_v = v.view(1, 8, heads, head_dim).transpose(1, 2)
    token = x[:, -1:, :]
    for _step in range(steps):
        q, k, v = qkv(token).split(width, dim=-1)
        q = q.view(1, 1, heads, head_dim).transpose(1, 2)
        cache_k = torch.cat([cache_k, k.view(1, 1, heads, head_dim).transpose(1, 2)], dim=2)
        cache_v = torch.cat([cache_v, v.view(1, 1, heads, head_dim).transpose(1, 2)], dim=2)
        y = F.scaled_dot_product_attention(q, cache_k, cache_v)
        token = out(y.transpose(1, 2).reshape(1, 1, width))
