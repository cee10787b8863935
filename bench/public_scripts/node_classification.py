"""What pytorch/examples' two graph scripts (gat/main.py, gcn/main.py) share, once: the
Cora-like node data (row-scaled bag-of-words features, labels, citations; the labels
shuffled for the chance_level fault), the split by a random permutation, and the
full-batch loop with the hook added as the README says: one update on the training nodes,
then the scripts' `test()` on the training nodes and on the validation nodes (eval mode,
no autograd) after each, and on the test nodes at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .capture import torch_hook
from .synthetic import citation_graph, shuffled


def node_data(nodes: int, edges: int, seed: int, fault: str | None, splits: tuple[int, int]) -> tuple[Any, Any, Any, tuple[Any, Any, Any]]:
    """(features (nodes, 1433) row-scaled as the scripts scale them, labels, edges
    (edges, 2) as numpy, (test, validation, training) node indices) of a Cora-like graph
    with 7 classes: `splits` (test, validation) are the sizes the scripts take first from a
    random permutation of the nodes (drawn here, before the model, as they draw it)."""
    import torch

    words, labels, citations = citation_graph(nodes, 1433, 7, edges, seed=seed)
    if fault == "chance_level":
        labels = shuffled(labels)
    features = torch.from_numpy(words)
    idx = torch.randperm(nodes)
    parts = (idx[: splits[0]], idx[splits[0] : splits[0] + splits[1]], idx[splits[0] + splits[1] :])
    return features / features.sum(dim=1, keepdim=True).clamp(min=1), torch.from_numpy(labels), citations, parts


def train_full_batch(out_dir: Path, config: str, model: Any, optimizer: Any, inputs: tuple, labels: Any, parts: tuple[Any, Any, Any], epochs: int) -> None:
    """The scripts' loop, hooked; `parts`: the (test, validation, training) node indices."""
    import torch
    import torch.nn as nn

    criterion = nn.NLLLoss()
    idx_test, idx_val, idx_train = parts

    def test(mask: torch.Tensor) -> float:
        model.eval()
        with torch.no_grad():
            return criterion(model(*inputs)[mask], labels[mask]).item()

    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        hook.register_loss(criterion)
        for _epoch in range(epochs):
            model.train()
            optimizer.zero_grad()
            loss = criterion(model(*inputs)[idx_train], labels[idx_train])
            loss.backward()
            optimizer.step()
            test(idx_train)
            test(idx_val)
        test(idx_test)
