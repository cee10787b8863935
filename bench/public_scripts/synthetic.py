"""Synthetic stand-ins for the public scripts' data sets: the same shapes and value ranges,
small, deterministic, and learnable (a healthy run really learns), built with numpy so the
PyTorch and Keras programs share them. `shuffled(labels)` breaks the link between inputs
and labels for the chance-level fault."""

from __future__ import annotations

import numpy as np


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _smooth(field: np.ndarray, passes: int = 2) -> np.ndarray:
    """A cheap blur over the last two axes: class templates with structure, not white noise."""
    for _ in range(passes):
        field = (field + np.roll(field, 1, -1) + np.roll(field, -1, -1) + np.roll(field, 1, -2) + np.roll(field, -1, -2)) / 5.0
    return field


def class_images(n: int, classes: int, shape: tuple[int, ...], seed: int, noise: float = 0.6, template_seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """`n` images of `shape` (channels first) in [0, 1]: a per-class smooth template plus
    Gaussian noise. Templates depend on `template_seed` only, so train and validation
    sets built with different `seed`s share the classes."""
    templates = _smooth(_rng(template_seed).standard_normal((classes, *shape)))
    templates = (templates - templates.mean()) / (templates.std() + 1e-8)
    rng = _rng(seed)
    labels = rng.integers(0, classes, n)
    images = templates[labels] + noise * rng.standard_normal((n, *shape))
    images = 1.0 / (1.0 + np.exp(-images))  # [0, 1], like ToTensor() output
    return images.astype(np.float32), labels.astype(np.int64)


def digits(n: int, seed: int, classes: int = 10, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-shaped images (n, 1, size, size) in [0, 1] with MNIST's value distribution:
    mostly black background, about 15 % near-white "ink" in a per-class stroke pattern,
    each sample shifted by up to 2 pixels, with some ink missing and a soft edge."""
    field = _smooth(_rng(2024).standard_normal((classes, size, size)), passes=4)
    centre = np.zeros((size, size))
    centre[4:-4, 6:-6] = 1.0  # ink stays in the middle, as in centred digits
    field = field * centre - (1 - centre) * 10
    cut = np.quantile(field.reshape(classes, -1), 0.85, axis=1)[:, None, None]
    templates = (field > cut).astype(np.float64)
    rng = _rng(seed)
    labels = rng.integers(0, classes, n)
    shifts = rng.integers(-2, 3, (n, 2))
    images = np.empty((n, size, size))
    for i in range(n):
        images[i] = np.roll(templates[labels[i]], tuple(shifts[i]), axis=(0, 1))
    images *= rng.random((n, size, size)) > 0.15
    images = np.clip(_smooth(images[:, None], passes=1)[:, 0] * 1.6, 0.0, 1.0)
    return images[:, None].astype(np.float32), labels.astype(np.int64)


def generated_images(n: int, shape: tuple[int, ...], seed: int, components: int = 6) -> np.ndarray:
    """Images a generator can learn: mixtures of a few smooth components, in [-1, 1]
    (the GAN scripts normalise with mean 0.5, std 0.5)."""
    basis = _smooth(_rng(99).standard_normal((components, *shape)), passes=3)
    basis /= np.abs(basis).max(axis=tuple(range(1, basis.ndim)), keepdims=True)
    weights = _rng(seed).dirichlet(np.ones(components), size=n)
    images = np.tensordot(weights, basis, axes=1) * 2.5
    return np.tanh(images).astype(np.float32)


def markov_tokens(length: int, vocab: int, seed: int, successors: int = 3) -> np.ndarray:
    """A token stream from a sparse Markov chain (each token has `successors` likely next
    tokens): a language model can get well below ln(vocab)."""
    table_rng = _rng(4321)
    table = table_rng.integers(0, vocab, (vocab, successors))
    rng = _rng(seed)
    out = np.empty(length, dtype=np.int64)
    token = int(rng.integers(vocab))
    for i in range(length):
        out[i] = token
        token = int(table[token, rng.integers(successors)]) if rng.random() < 0.9 else int(rng.integers(vocab))
    return out


def sentiment_tokens(n: int, maxlen: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """IMDB-shaped token sequences (ids in [1, vocab), left-padded with 0 like
    `pad_sequences`); the label says whether "positive" tokens (ids 10-19) outnumber
    "negative" ones (20-29)."""
    rng = _rng(seed)
    tokens = rng.integers(30, vocab, (n, maxlen))
    labels = rng.integers(0, 2, n)
    for i in range(n):
        marked = rng.choice(maxlen, size=8, replace=False)
        major = 10 if labels[i] == 1 else 20
        tokens[i, marked[:6]] = rng.integers(major, major + 10, 6)
        tokens[i, marked[6:]] = rng.integers(30 - major, 40 - major, 2)
        pad = int(rng.integers(0, maxlen // 4))
        tokens[i, :pad] = 0
    return tokens.astype(np.int64), labels.astype(np.int64)


def waves(n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """FordA-shaped univariate series (n, length, 1), standardised: class 1 carries a
    faster oscillation than class 0, both with random phase and noise."""
    rng = _rng(seed)
    labels = rng.integers(0, 2, n)
    t = np.arange(length)[None, :]
    freq = np.where(labels == 1, 0.18, 0.06)[:, None] * (1 + 0.1 * rng.standard_normal((n, 1)))
    series = np.sin(freq * t + rng.uniform(0, 2 * np.pi, (n, 1))) + 0.5 * rng.standard_normal((n, length))
    series = (series - series.mean(axis=1, keepdims=True)) / series.std(axis=1, keepdims=True)
    return series[..., None].astype(np.float32), labels.astype(np.int64)


def citation_graph(nodes: int, features: int, classes: int, edges: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Cora-like graph: (binary bag-of-words features (nodes, features), labels, edges
    (edges, 2)). Each class has 20 topic words of which a node holds 4, over 1 % random
    words; 80 % of the edges join nodes of one class (citations stay mostly within a
    field), so the features and the neighbours both tell the class."""
    rng = _rng(seed)
    labels = rng.integers(0, classes, nodes)
    words = rng.random((nodes, features)) < 0.01
    topics = rng.permutation(features)[: classes * 20].reshape(classes, 20)
    for node in range(nodes):
        words[node, rng.choice(topics[labels[node]], 4, replace=False)] = True
    members = [np.flatnonzero(labels == c) for c in range(classes)]
    source = rng.integers(0, nodes, edges)
    within = rng.random(edges) < 0.8
    target = np.array([rng.choice(members[labels[s]]) if w else rng.integers(0, nodes) for s, w in zip(source, within)])
    return words.astype(np.float32), labels.astype(np.int64), np.stack([source, target], axis=1).astype(np.int64)


def shuffled(labels: np.ndarray, seed: int = 7) -> np.ndarray:
    """The labels in a random order: inputs no longer tell the label (a broken pipeline)."""
    return labels[_rng(seed).permutation(len(labels))]


__all__ = ["citation_graph", "class_images", "digits", "generated_images", "markov_tokens", "sentiment_tokens", "waves", "shuffled"]
