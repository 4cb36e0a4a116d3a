"""Small torch models for fedsim.

Rules
-----
1. No BatchNorm and no buffers: models hold trainable parameters only
   (no normalization, or GroupNorm), so "the model" is exactly the flat
   vector of its parameters (docs/algorithms.md#no-batchnorm).
2. Initial weights depend only on ``(name, input_shape, num_classes, options,
   seed)``: :func:`build_model` draws them from a local ``torch.Generator``
   and never touches the global torch RNG, so every process builds the same
   initial model.
"""

from fedsim.models._build import MODELS, build_from, build_model, param_spec
from fedsim.models._init import init_parameters
from fedsim.models._nets import CNN, MLP, CharLSTM, CNNMnist

__all__ = [
    "CNN",
    "MLP",
    "MODELS",
    "CNNMnist",
    "CharLSTM",
    "build_from",
    "build_model",
    "init_parameters",
    "param_spec",
]
