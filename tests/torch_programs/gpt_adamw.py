"""A small GPT (causal self-attention through F.scaled_dot_product_attention), two AdamW steps.

Sizes from argv: width layers heads batch length vocab (defaults: a tiny model); MIXED=bf16
runs the forward pass under torch.autocast."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

width, layers, heads, batch, length, vocab = (
    [int(a) for a in sys.argv[1:7]] if len(sys.argv) >= 7 else [64, 2, 4, 2, 32, 100])
# TORCH_PROGRAM_DEVICE=meta runs it on the meta device without a recorder (a benchmark's floor)
device = os.environ.get("TORCH_PROGRAM_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


torch.manual_seed(0)
with torch.device(device):
    model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(2):
    idx = torch.randint(0, vocab, (batch, length), device=device)
    # MIXED=bf16: forward and loss under torch.autocast (bf16), as mixed-precision training runs
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=os.environ.get("MIXED") == "bf16"):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, vocab), idx.view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
