"""Mirrors keras-team/keras-io `examples/nlp/text_classification_with_transformer.py`: token
and position embeddings, one transformer block (MultiHeadAttention with 2 heads and
key_dim 32, a Dense(32, relu)-Dense(32) feed-forward, LayerNormalization eps 1e-6, dropout
0.1), GlobalAveragePooling1D, Dropout 0.1, Dense(20, relu), Dropout 0.1, Dense(2, softmax);
`compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])`,
`fit(batch_size=32, epochs=2, validation_data=...)`. Scaled for CPU seconds: a 2,000-token
vocabulary and sequences of 64 instead of 20,000 and 200, 3,200 synthetic IMDB-shaped
reviews (the label says which of two token groups dominates) instead of IMDB, 3 epochs
(300 steps: the quick-start capture then saves 3 tensor steps) instead of 2.

Faults: `chance_level` (shuffled training labels), `overfit` (64 training reviews, 40 epochs)."""

from __future__ import annotations

from pathlib import Path

from .capture import keras_callback
from .synthetic import sentiment_tokens, shuffled


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(7)
    vocab_size, maxlen, embed_dim, num_heads, ff_dim = 2000, 64, 32, 2, 32

    class TransformerBlock(layers.Layer):
        def __init__(self, rate=0.1):
            super().__init__()
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs):
            out1 = self.layernorm1(inputs + self.dropout1(self.att(inputs, inputs)))
            return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self):
            super().__init__()
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            return self.token_emb(x) + self.pos_emb(ops.arange(0, ops.shape(x)[-1], 1))

    train_n, epochs = (64, 40) if fault == "overfit" else (3200, 3)
    x_train, y_train = sentiment_tokens(train_n, maxlen, vocab_size, seed=1)
    x_val, y_val = sentiment_tokens(512, maxlen, vocab_size, seed=2)
    if fault == "chance_level":
        y_train = shuffled(y_train)
    inputs = layers.Input(shape=(maxlen,))
    x = TransformerBlock()(TokenAndPositionEmbedding()(inputs))
    x = layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(x))
    x = layers.Dropout(0.1)(layers.Dense(20, activation="relu")(x))
    model = keras.Model(inputs=inputs, outputs=layers.Dense(2, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    with keras_callback(out_dir, config) as callback:
        model.fit(x_train, y_train, batch_size=32, epochs=epochs, validation_data=(x_val, y_val), callbacks=[callback], verbose=0)
