"""Mirrors keras-team/keras-io `examples/vision/mnist_convnet.py`: Conv2D(3x3, relu),
MaxPooling2D, Conv2D(3x3, relu), MaxPooling2D, Flatten, Dropout 0.5, Dense(10, softmax);
`compile(loss="categorical_crossentropy", optimizer="adam")` on one-hot labels,
`fit(batch_size=128, validation_split=0.1)`. Scaled for CPU seconds: 8 and 16 filters
instead of 32 and 64, 4,096 synthetic 28x28x1 "digits" in [0, 1] (10 stroke patterns,
shifted, MNIST's ink density) instead of MNIST, 8 epochs (232 steps) instead of 15.

Faults: `dead_relu` (the first convolution's bias initialised to -20), `divergence` (Adam
lr 10), `nan_input` (one training image holds a NaN)."""

from __future__ import annotations

from pathlib import Path

from .capture import keras_callback
from .synthetic import digits


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import keras
    import numpy as np
    from keras import layers

    keras.utils.set_random_seed(7)
    images, labels = digits(4096, seed=51)
    x_train = np.moveaxis(images, 1, -1)  # channels last, as the script's np.expand_dims(x, -1)
    if fault == "nan_input":
        x_train[1000, 14, 14, 0] = np.nan
    y_train = keras.utils.to_categorical(labels, 10)
    first_bias = keras.initializers.Constant(-20.0) if fault == "dead_relu" else "zeros"
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(8, kernel_size=(3, 3), activation="relu", bias_initializer=first_bias),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    optimizer = keras.optimizers.Adam(learning_rate=10.0) if fault == "divergence" else "adam"
    model.compile(loss="categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])
    with keras_callback(out_dir, config) as callback:
        model.fit(x_train, y_train, batch_size=128, epochs=8, validation_split=0.1, callbacks=[callback], verbose=0)
