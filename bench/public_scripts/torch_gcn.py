"""Mirrors pytorch/examples `gcn/main.py`: a two-layer graph convolutional network (each
layer's parameter a `kernel`, Xavier-initialised, no bias as the script's default; sparse
products with the renormalised adjacency D^-1/2 (A + I) D^-1/2), ReLU as a function and
dropout 0.5 between the layers, log-softmax out; full-batch Adam (lr 0.01, weight decay
5e-4) and NLLLoss on the training nodes, and after each update the script's `test()` on
the training and then the validation nodes (eval mode, `torch.no_grad()`). Data: a
synthetic graph of Cora's size and format (2,708 nodes, 1,433 binary word features
row-normalised, 7 classes, 5,429 citations; the script downloads Cora), split as the
script splits it (1,000 test, 500 validation, the rest training); its default 200 epochs.

Faults: `chance_level` (the labels shuffled: the model memorises the training nodes while
the validation nodes stay at ln 7), `lr_zero`."""

from __future__ import annotations

from pathlib import Path

from .node_classification import node_data, train_full_batch


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(42)

    class GraphConv(nn.Module):
        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.kernel = nn.Parameter(torch.empty(in_features, out_features))
            nn.init.xavier_normal_(self.kernel)

        def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
            return torch.spmm(adj, torch.mm(h, self.kernel))

    class GCN(nn.Module):
        def __init__(self, in_features: int, hidden: int, classes: int, dropout: float):
            super().__init__()
            self.gc1, self.gc2 = GraphConv(in_features, hidden), GraphConv(hidden, classes)
            self.dropout = nn.Dropout(dropout)

        def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(self.gc2(self.dropout(F.relu(self.gc1(h, adj))), adj), dim=1)

    features, labels, edges, parts = node_data(2708, 5429, seed=5, fault=fault, splits=(1000, 500))
    n = len(labels)
    adj = torch.eye(n)  # self-loops, as the script adds them
    adj[edges[:, 0], edges[:, 1]] = 1
    scale = adj.sum(dim=1).rsqrt()
    adj = (scale[:, None] * adj * scale[None, :]).to_sparse()  # the renormalisation trick

    model = GCN(1433, 16, 7, 0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0 if fault == "lr_zero" else 0.01, weight_decay=5e-4)
    train_full_batch(out_dir, config, model, optimizer, (features, adj), labels, parts, epochs=200)
