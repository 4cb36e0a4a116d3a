"""Small torch models: no BatchNorm, hence no buffers (docs/algorithms.md#no-batchnorm).

Every model maps a float32 batch ``(N, *input_shape)`` to ``(N, num_classes)``
scores for ``torch.nn.functional.cross_entropy``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CNN", "MLP", "CNNMnist", "CharLSTM"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value!r} (must be an int >= 1)")
    return value


def _sizes(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, int | str) or not isinstance(values, Sequence):
        raise ValueError(f"Invalid {name}: {values!r} (must be a list of ints >= 1)")
    return tuple(_positive(f"{name} entry", v) for v in values)


def _image_shape(model: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(
            f"Invalid input_shape for {model!r}: {input_shape} (needs (channels, "
            "height, width); use flatten=False when building the data)"
        )
    c, h, w = input_shape
    return c, h, w


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs.

    ``hidden_sizes=(200,)`` is the usual Synthetic(1,1) model (60-200-10);
    ``(200, 200)`` gives AsyncFedED's three-layer 60-200-200-10 MLP.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        hidden_sizes: Sequence[int] = (200,),
    ) -> None:
        super().__init__()
        sizes = [math.prod(input_shape), *_sizes("hidden_sizes", hidden_sizes)]
        layers: list[nn.Module] = [nn.Flatten()]
        for fan_in, fan_out in itertools.pairwise(sizes):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``(N, num_classes)``."""
        return self.net(x)  # type: ignore[no-any-return]


class CNN(nn.Module):
    """A small CNN: per stage conv3x3 (pad 1) [GroupNorm] ReLU maxpool2, then two FCs.

    Works for 1x8x8 digits, 1x28x28 MNIST and 3x32x32 CIFAR-10 alike; the
    flattened size is computed from ``input_shape``. ``norm="group"`` adds
    ``GroupNorm(groups, C)`` after each conv (the FedSpeed authors' choice).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        channels: Sequence[int] = (32, 64),
        hidden: int = 128,
        norm: str = "none",
        groups: int = 2,
    ) -> None:
        super().__init__()
        c, h, w = _image_shape("cnn", input_shape)
        chans = _sizes("channels", channels)
        hidden = _positive("hidden", hidden)
        if norm not in ("none", "group"):
            raise ValueError(f"Invalid norm: {norm!r} (allowed: none, group)")
        groups = _positive("groups", groups)
        if min(h, w) < 2 ** len(chans):
            raise ValueError(
                f"Invalid input_shape for 'cnn': {input_shape} is too small for "
                f"{len(chans)} pooling stages (needs >= {2 ** len(chans)} pixels)"
            )
        layers: list[nn.Module] = []
        for out in chans:
            layers.append(nn.Conv2d(c, out, kernel_size=3, padding=1))
            if norm == "group":
                if out % groups:
                    raise ValueError(
                        f"Invalid groups: {groups} does not divide {out} channels"
                    )
                layers.append(nn.GroupNorm(groups, out))
            layers += [nn.ReLU(), nn.MaxPool2d(2)]
            c, h, w = out, h // 2, w // 2
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``(N, num_classes)``."""
        return self.classifier(self.features(x))  # type: ignore[no-any-return]


class CNNMnist(nn.Module):
    """The Delta-SGD authors' MNIST/FMNIST CNN (``CNNMnist``, docs/algorithms.md#models).

    conv(C->10, 5) maxpool2 ReLU; conv(10->20, 5) Dropout2d maxpool2 ReLU;
    fc(320->50) ReLU dropout(0.5); fc(50->classes); log_softmax. The
    log_softmax is kept for fidelity: it is idempotent under
    ``cross_entropy``, so losses and argmax equal those of the raw logits.
    The flattened size (320 for 28x28) is computed from ``input_shape``.
    Dropout draws from torch's global generator in training mode: fork it
    (``torch.random.fork_rng``) around a training step for reproducible runs.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = _image_shape("cnn_mnist", input_shape)
        h2, w2 = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        if h2 < 1 or w2 < 1:
            raise ValueError(
                f"Invalid input_shape for 'cnn_mnist': {input_shape} (two 5x5 "
                "convolutions and two poolings need at least 16x16 pixels)"
            )
        self.conv1 = nn.Conv2d(c, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(20 * h2 * w2, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``(N, num_classes)``."""
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class CharLSTM(nn.Module):
    """Next-character LSTM for LEAF Shakespeare (embedding 8, 2 LSTM layers).

    Input: ``(N, seq_len)`` character indices (the float32 indices that
    :mod:`fedsim.data` stores, or an integer tensor). Output: scores over the
    vocabulary for the character after the sequence, from the last LSTM
    output. LEAF's reference model uses hidden 256; DGA uses 1500.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        vocab_size: int | None = None,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(
                f"Invalid input_shape for 'char_lstm': {input_shape} (needs (seq_len,))"
            )
        vocab = _positive(
            "vocab_size", num_classes if vocab_size is None else vocab_size
        )
        self.embedding = nn.Embedding(vocab, _positive("embedding_dim", embedding_dim))
        self.lstm = nn.LSTM(
            embedding_dim,
            _positive("hidden_size", hidden_size),
            num_layers=_positive("num_layers", num_layers),
            batch_first=True,
        )
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores ``(N, num_classes)`` for the next character."""
        out, _ = self.lstm(self.embedding(x.long()))
        return self.fc(out[:, -1, :])  # type: ignore[no-any-return]
