"""Mirrors huggingface/transformers `examples/pytorch/text-classification/run_glue.py`: a
BERT sequence classifier (`BertForSequenceClassification`: token, position and segment
embeddings, GELU encoder layers, a pooler and a linear classifier) trained by the `Trainer`
with its defaults (AdamW, linear decay, no warm-up), `per_device_train_batch_size` 32 and
an evaluation after every epoch (`eval_strategy="epoch"`). Scaled for CPU seconds: a BERT
built from a small config (2 layers, hidden 64, 2 heads, feed-forward 128, a 2,000-token
vocabulary; random weights, nothing downloaded) instead of a pretrained checkpoint, so it
trains from scratch with learning rate 1e-3 instead of fine-tuning at 2e-5; 3,200
synthetic IMDB-shaped reviews of 64 tokens (the label says which of two token groups
dominates, padding masked) instead of a GLUE task, 3 epochs (300 updates).

Faults: `chance_level` (shuffled training labels), `lr_zero`."""

from __future__ import annotations

import os
from pathlib import Path

from .capture import hf_callback
from .synthetic import sentiment_tokens, shuffled


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.set_seed(3)

    class Reviews(torch.utils.data.Dataset):
        def __init__(self, tokens, labels):
            self.ids, self.labels = torch.from_numpy(tokens), torch.from_numpy(labels)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            ids = self.ids[i]
            return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": self.labels[i]}

    vocab, maxlen = 2000, 64
    x_train, y_train = sentiment_tokens(3200, maxlen, vocab, seed=11)
    x_val, y_val = sentiment_tokens(512, maxlen, vocab, seed=12)
    if fault == "chance_level":
        y_train = shuffled(y_train)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=maxlen, num_labels=2,
    ))
    args = transformers.TrainingArguments(
        output_dir=str(Path(out_dir).parent / f"{Path(out_dir).name}-hf"), per_device_train_batch_size=32, per_device_eval_batch_size=128,
        num_train_epochs=3, learning_rate=0.0 if fault == "lr_zero" else 1e-3, eval_strategy="epoch", logging_steps=10,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=3, dataloader_num_workers=0,
    )
    callback = hf_callback(out_dir, config)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Reviews(x_train, y_train), eval_dataset=Reviews(x_val, y_val),
                                   callbacks=[callback])
    trainer.train()
    callback.close()
