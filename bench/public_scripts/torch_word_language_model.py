"""Mirrors pytorch/examples `word_language_model/main.py` with its default `--model LSTM`:
an embedding, a 2-layer LSTM with dropout 0.2, a linear decoder and log-softmax
(`model.py`'s RNNModel, encoder and decoder initialised U(-0.1, 0.1)), `nn.NLLLoss`, batches
cut by `batchify` into columns and read `bptt` tokens at a time with the hidden state
detached between batches; no optimizer: the script's own SGD update
`p.data.add_(p.grad, alpha=-lr)` with lr 20 after `clip_grad_norm_(..., 0.25)`; after each
epoch an evaluation pass, and lr divided by 4 when the validation loss did not improve.
Scaled for CPU seconds: embedding and hidden size 64 instead of 200, a 50-token vocabulary
with a sparse Markov chain instead of Wikitext-2, bptt 20, 2 epochs of 100 batches.

No optimizer to register: every forward in training mode is a TRAIN step.

Faults: `divergence` (lr 2000), `chance_level` (targets shuffled against the inputs),
`slow_lr` (lr 0.02)."""

from __future__ import annotations

from pathlib import Path

from .capture import torch_hook
from .synthetic import markov_tokens, shuffled


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(1111)
    ntokens, emsize, nhid, nlayers, dropout, bptt, batch_size, eval_batch_size, clip = 50, 64, 64, 2, 0.2, 20, 20, 10, 0.25

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntokens, emsize)
            self.rnn = nn.LSTM(emsize, nhid, nlayers, dropout=dropout)
            self.decoder = nn.Linear(nhid, ntokens)
            nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def forward(self, tokens, hidden):
            output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
            decoded = self.decoder(self.drop(output)).view(-1, ntokens)
            return F.log_softmax(decoded, dim=1), hidden

        def init_hidden(self, bsz):
            weight = next(self.parameters())
            return (weight.new_zeros(nlayers, bsz, nhid), weight.new_zeros(nlayers, bsz, nhid))

    def batchify(stream, bsz):
        data = torch.from_numpy(stream)
        nbatch = data.size(0) // bsz
        return data[: nbatch * bsz].view(bsz, -1).t().contiguous()

    train_stream = markov_tokens(batch_size * bptt * 100 + 1, ntokens, seed=1)
    train_data = batchify(train_stream, batch_size)
    train_targets = train_data
    if fault == "chance_level":
        train_targets = batchify(shuffled(train_stream), batch_size)
    val_data = batchify(markov_tokens(eval_batch_size * bptt * 20 + 1, ntokens, seed=2), eval_batch_size)

    def get_batch(source, targets, i):
        seq_len = min(bptt, len(source) - 1 - i)
        return source[i : i + seq_len], targets[i + 1 : i + 1 + seq_len].reshape(-1)

    def repackage_hidden(h):
        return tuple(v.detach() for v in h)

    model = RNNModel()
    criterion = nn.NLLLoss()
    lr = {"divergence": 2000.0, "slow_lr": 0.02}.get(fault or "", 20.0)
    best_val_loss = None
    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_loss(criterion)
        for _epoch in range(2):
            model.train()
            hidden = model.init_hidden(batch_size)
            for i in range(0, train_data.size(0) - 1, bptt):
                data, targets = get_batch(train_data, train_targets, i)
                model.zero_grad()
                hidden = repackage_hidden(hidden)
                output, hidden = model(data, hidden)
                loss = criterion(output, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)
            model.eval()
            total, hidden = 0.0, model.init_hidden(eval_batch_size)
            with torch.no_grad():
                for i in range(0, val_data.size(0) - 1, bptt):
                    data, targets = get_batch(val_data, val_data, i)
                    output, hidden = model(data, hidden)
                    total += len(data) * criterion(output, targets).item()
            val_loss = total / (len(val_data) - 1)
            if best_val_loss is None or val_loss < best_val_loss:
                best_val_loss = val_loss
            else:
                lr /= 4.0
