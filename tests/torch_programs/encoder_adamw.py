"""The issue's model: TransformerEncoderLayers (batch_first, GELU), an embedding and a head,
AdamW, one step. argv: width layers heads batch length vocab."""
import sys

import torch
import torch.nn as nn

width, layers, heads, batch, length, vocab = (
    [int(a) for a in sys.argv[1:7]] if len(sys.argv) >= 7 else [64, 2, 4, 2, 32, 100])
device = "cuda" if torch.cuda.is_available() else "cpu"


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                       activation="gelu", batch_first=True)
            for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


with torch.device(device):
    model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
idx = torch.randint(0, vocab, (batch, length), device=device)
loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
