"""Mirrors keras-team/keras-io `examples/timeseries/timeseries_classification_transformer.py`:
transformer encoder blocks (MultiHeadAttention with dropout, Dropout, LayerNormalization
eps 1e-6, residual; a Conv1D(ff_dim, 1, relu)-Conv1D(features, 1) feed-forward, residual),
GlobalAveragePooling1D, an MLP head with dropout 0.4, Dense(n_classes, softmax);
`sparse_categorical_crossentropy`, Adam with lr 1e-4, batch 64, `validation_split=0.2`,
EarlyStopping(patience=10, restore_best_weights=True). Scaled for CPU seconds: head_size 16
and 2 heads instead of 256 and 4, 2 blocks instead of 4, an MLP of 32 instead of 128, ff_dim
4 and dropout 0.25 as the script; 2,400 synthetic univariate series of 64 points (FordA has
500) whose class is the oscillation frequency, 8 epochs instead of up to 200.

Faults: `divergence` (lr 1.0), `chance_level` (shuffled labels)."""

from __future__ import annotations

from pathlib import Path

from .capture import keras_callback
from .synthetic import shuffled, waves


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import keras
    from keras import layers

    keras.utils.set_random_seed(7)
    x_train, y_train = waves(2400, 64, seed=1)
    if fault == "chance_level":
        y_train = shuffled(y_train)
    n_classes = 2

    def transformer_encoder(inputs, head_size, num_heads, ff_dim, dropout):
        x = layers.MultiHeadAttention(key_dim=head_size, num_heads=num_heads, dropout=dropout)(inputs, inputs)
        res = layers.LayerNormalization(epsilon=1e-6)(layers.Dropout(dropout)(x)) + inputs
        x = layers.Conv1D(filters=ff_dim, kernel_size=1, activation="relu")(res)
        x = layers.Conv1D(filters=inputs.shape[-1], kernel_size=1)(layers.Dropout(dropout)(x))
        return layers.LayerNormalization(epsilon=1e-6)(x) + res

    inputs = keras.Input(shape=x_train.shape[1:])
    x = inputs
    for _ in range(2):
        x = transformer_encoder(x, head_size=16, num_heads=2, ff_dim=4, dropout=0.25)
    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    x = layers.Dropout(0.4)(layers.Dense(32, activation="relu")(x))
    model = keras.Model(inputs, layers.Dense(n_classes, activation="softmax")(x))
    model.compile(
        loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.Adam(learning_rate=1.0 if fault == "divergence" else 1e-4),
        metrics=["sparse_categorical_accuracy"],
    )
    with keras_callback(out_dir, config) as callback:
        model.fit(
            x_train, y_train, validation_split=0.2, epochs=8, batch_size=64, verbose=0,
            callbacks=[keras.callbacks.EarlyStopping(patience=10, restore_best_weights=True), callback],
        )
