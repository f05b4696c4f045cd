"""An ordinary training loop, as PyTorch's tutorials write it: the device from torch.accelerator,
an MLP, torch.optim.AdamW with its defaults, loss.backward(), optimizer.step(), zero_grad().

Sizes from argv: features hidden classes batch steps (defaults: small). MIXED=bf16 runs the
forward pass and the loss under torch.autocast. At the end it keeps only the model and the
optimizer, so what is live then is the parameters and AdamW's two moments.
"""
import os
import sys

import torch
from torch import nn

features, hidden, classes, batch, steps = (
    [int(a) for a in sys.argv[1:6]] if len(sys.argv) >= 6 else [32, 64, 10, 8, 3])
device = (torch.accelerator.current_accelerator().type if torch.accelerator.is_available()
          else "cpu")

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
loss_fn = nn.CrossEntropyLoss()
for _step in range(steps):
    x = torch.randn(batch, features, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16,
                        enabled=os.environ.get("MIXED") == "bf16"):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
del x, y, loss
