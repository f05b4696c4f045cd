"""Mixed precision: a transformer-ish MLP block and attention under torch.autocast (bf16),
AdamW, two steps. argv: width batch length. AUTOCAST_DEVICE chooses autocast's device type
(default: the tensors' own, "cuda" when recording)."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

width, batch, length = ([int(a) for a in sys.argv[1:4]] if len(sys.argv) >= 4 else [64, 2, 16])
device = "cuda" if torch.cuda.is_available() else "cpu"
heads = 4
model = nn.ModuleDict({"ln": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width),
                       "up": nn.Linear(width, 4 * width), "down": nn.Linear(4 * width, width),
                       "head": nn.Linear(width, 10)}).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(2):
    x = torch.randn(batch, length, width, device=device)
    target = torch.randint(0, 10, (batch * length,), device=device)
    kind = os.environ.get("AUTOCAST_DEVICE", x.device.type)
    with torch.autocast(device_type=kind, dtype=torch.bfloat16):
        h = model["ln"](x)
        q, k, v = model["qkv"](h).split(width, dim=-1)
        q, k, v = (t.view(batch, length, heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + a.transpose(1, 2).reshape(batch, length, width)
        h = h + model["down"](F.gelu(model["up"](h)))
        logits = model["head"](h).flatten(0, 1)
        loss = F.cross_entropy(logits, target) + logits.softmax(-1).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
