"""A small CNN (conv, batch norm, pooling), three SGD-with-momentum steps. argv: batch size."""
import sys

import torch
import torch.nn as nn

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 4
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
for _step in range(3):
    images = torch.randn(batch, 3, 32, 32).to(device)
    labels = torch.randint(0, 10, (batch,)).to(device)
    loss = nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
