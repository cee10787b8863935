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

from .capture import torch_hook
from .synthetic import citation_graph, shuffled


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

    words, labels_np, edges = citation_graph(2708, 1433, 7, 5429, seed=5)
    if fault == "chance_level":
        labels_np = shuffled(labels_np)
    features = torch.from_numpy(words)
    features = features / features.sum(dim=1, keepdim=True).clamp(min=1)  # the script's row scaling
    labels = torch.from_numpy(labels_np)
    n = len(labels)
    adj = torch.sparse_coo_tensor(torch.from_numpy(edges.T), torch.ones(len(edges)), (n, n)).coalesce().to_dense()
    adj = (adj > 0).float() + torch.eye(n)  # self-loops, as the script adds them
    scale = adj.sum(dim=1).rsqrt()
    adj = (scale[:, None] * adj * scale[None, :]).to_sparse()  # the renormalisation trick
    idx = torch.randperm(n)
    idx_test, idx_val, idx_train = idx[:1000], idx[1000:1500], idx[1500:]

    model = GCN(1433, 16, 7, 0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0 if fault == "lr_zero" else 0.01, weight_decay=5e-4)
    criterion = nn.NLLLoss()

    def test(mask: torch.Tensor) -> float:
        model.eval()
        with torch.no_grad():
            return criterion(model(features, adj)[mask], labels[mask]).item()

    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        hook.register_loss(criterion)
        for _epoch in range(200):
            model.train()
            optimizer.zero_grad()
            loss = criterion(model(features, adj)[idx_train], labels[idx_train])
            loss.backward()
            optimizer.step()
            test(idx_train)
            test(idx_val)
        test(idx_test)
