"""Mirrors pytorch/examples `gat/main.py`: a two-layer graph attention network (the layer's
own parameters `W` and `a`, named as the script names them, eight heads averaged, LeakyReLU
scores masked by the adjacency matrix, softmax, dropout 0.6, ELU between the layers,
log-softmax out), full-batch training with Adam (lr 5e-3, weight decay 5e-4) and NLLLoss on
the training nodes, and after each update the script's `test()` on the training and the
validation nodes (eval mode, `torch.no_grad()`). Scaled for CPU seconds: a Cora-like
synthetic graph of 600 nodes (Cora: 2,708), Cora's 1,433 word features, 7 classes and
1,200 citations, row-normalised features and self-loops as the script builds them; 210
epochs (the script's default is 300), so that the quick start's interval of 100 saves
tensors three times.

Faults: `chance_level` (the labels shuffled), `zero_init` (every parameter 0: caught only
if the layer's `W` and `a` count as weights)."""

from __future__ import annotations

from pathlib import Path

from .node_classification import node_data, train_full_batch


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(13)

    class GraphAttentionLayer(nn.Module):
        def __init__(self, in_features: int, out_features: int, n_heads: int, dropout: float = 0.4, slope: float = 0.2):
            super().__init__()
            self.n_heads, self.n_hidden, self.dropout = n_heads, out_features, dropout
            self.W = nn.Parameter(torch.empty(in_features, out_features * n_heads))
            self.a = nn.Parameter(torch.empty(n_heads, 2 * out_features, 1))
            self.leakyrelu = nn.LeakyReLU(slope)
            self.softmax = nn.Softmax(dim=1)
            nn.init.xavier_normal_(self.W)
            nn.init.xavier_normal_(self.a)

        def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
            n = h.shape[0]
            h = torch.mm(h, self.W).view(n, self.n_heads, self.n_hidden).permute(1, 0, 2)
            source = torch.matmul(h, self.a[:, : self.n_hidden, :])
            target = torch.matmul(h, self.a[:, self.n_hidden :, :])
            e = self.leakyrelu(source + target.mT)
            attention = self.softmax(torch.where(adj > 0, e, torch.full_like(e, -9e15)))
            attention = F.dropout(attention, self.dropout, training=self.training)
            return torch.matmul(attention, h).mean(dim=0)  # heads averaged (concat=False)

    class GAT(nn.Module):
        def __init__(self, in_features: int, n_hidden: int, n_heads: int, num_classes: int, dropout: float = 0.6):
            super().__init__()
            self.gat1 = GraphAttentionLayer(in_features, n_hidden, n_heads, dropout)
            self.gat2 = GraphAttentionLayer(n_hidden, num_classes, 1, dropout)

        def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(self.gat2(F.elu(self.gat1(x, adj)), adj), dim=1)

    features, labels, edges, parts = node_data(600, 1200, seed=31, fault=fault, splits=(200, 100))
    adj = torch.eye(600)
    adj[edges[:, 0], edges[:, 1]] = 1

    model = GAT(1433, 64, 8, 7)
    if fault == "zero_init":
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    train_full_batch(out_dir, config, model, optimizer, (features, adj), labels, parts, epochs=210)
