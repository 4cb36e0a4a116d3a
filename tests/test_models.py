"""Tests for fedsim.models: shapes, deterministic init, no buffers, errors."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from fedsim.models import MODELS, build_model, param_spec

CASES = [
    ("mlp", (60,), 10, {}),
    ("mlp", (60,), 10, {"hidden_sizes": [200, 200]}),
    ("mlp", (1, 8, 8), 10, {"hidden_sizes": []}),
    ("cnn", (1, 8, 8), 10, {}),
    ("cnn", (1, 28, 28), 10, {}),
    ("cnn", (3, 32, 32), 10, {"norm": "group", "groups": 2}),
    ("cnn_mnist", (1, 28, 28), 10, {}),
    ("cnn_mnist", (3, 32, 32), 10, {}),
    ("char_lstm", (80,), 80, {"hidden_size": 32}),
]
IDS = [f"{n}-{'x'.join(map(str, s))}-{len(o)}" for n, s, _, o in CASES]


def _batch(name: str, shape: tuple[int, ...], n: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if name == "char_lstm":  # character indices, stored as float32 by fedsim.data
        return torch.randint(0, 80, (n, *shape), generator=gen).float()
    return torch.rand((n, *shape), generator=gen)


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(("name", "shape", "classes", "opts"), CASES, ids=IDS)
def test_forward_shape_and_no_buffers(name, shape, classes, opts) -> None:
    model = build_model(name, shape, classes, seed=0, **opts)
    model.eval()
    out = model(_batch(name, shape))
    assert out.shape == (3, classes)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert list(model.buffers()) == []
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize(("name", "shape", "classes", "opts"), CASES, ids=IDS)
def test_init_is_deterministic_and_leaves_global_rng_alone(
    name, shape, classes, opts
) -> None:
    state = torch.random.get_rng_state()
    a = build_model(name, shape, classes, seed=42, **opts)
    b = build_model(name, shape, classes, seed=42, **opts)
    c = build_model(name, shape, classes, seed=43, **opts)
    assert torch.equal(state, torch.random.get_rng_state())
    for (na, pa), (nb, pb) in zip(
        a.named_parameters(), b.named_parameters(), strict=True
    ):
        assert na == nb
        assert torch.equal(pa, pb)
    assert _digest(a) != _digest(c)


def test_init_is_identical_in_another_process() -> None:
    script = (
        "import hashlib\nfrom fedsim.models import build_model\n"
        "for name, shape, k in [('mlp', (60,), 10), ('cnn', (1, 8, 8), 10)]:\n"
        "    h = hashlib.sha256()\n"
        "    for p in build_model(name, shape, k, seed=9).parameters():\n"
        "        h.update(p.detach().numpy().tobytes())\n"
        "    print(h.hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    here = [
        _digest(build_model("mlp", (60,), 10, seed=9)),
        _digest(build_model("cnn", (1, 8, 8), 10, seed=9)),
    ]
    assert out == here


def test_init_follows_pytorch_default_scheme() -> None:
    model = build_model("mlp", (60,), 10, seed=1, hidden_sizes=[500])
    w, b = model.net[1].weight, model.net[1].bias
    bound = 1 / math.sqrt(60)  # kaiming_uniform(a=sqrt(5)) and the bias bound
    assert w.abs().max() <= bound
    assert b.abs().max() <= bound
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    lstm = build_model("char_lstm", (5,), 80, seed=1, hidden_size=16)
    assert lstm.lstm.weight_hh_l1.abs().max() <= 1 / math.sqrt(16)
    assert lstm.embedding.weight.std().item() == pytest.approx(1.0, rel=0.1)
    gn = build_model("cnn", (3, 32, 32), 10, seed=1, norm="group")
    assert torch.equal(gn.features[1].weight, torch.ones(32))


def test_param_spec_and_architectures() -> None:
    mlp = build_model("mlp", (60,), 10, seed=0)
    assert param_spec(mlp) == [
        ("net.1.weight", (200, 60), "float32"),
        ("net.1.bias", (200,), "float32"),
        ("net.3.weight", (10, 200), "float32"),
        ("net.3.bias", (10,), "float32"),
    ]
    deep = build_model("mlp", (60,), 10, seed=0, hidden_sizes=[200, 200])
    assert [s for _, s, _ in param_spec(deep) if len(s) == 2] == [
        (200, 60),
        (200, 200),
        (10, 200),
    ]  # AsyncFedED's 60-200-200-10
    cnn_mnist = build_model("cnn_mnist", (1, 28, 28), 10, seed=0)
    shapes = {n: s for n, s, _ in param_spec(cnn_mnist)}
    assert shapes["conv1.weight"] == (10, 1, 5, 5)
    assert shapes["conv2.weight"] == (20, 10, 5, 5)
    assert shapes["fc1.weight"] == (50, 320)  # the authors' 320-50-10 head
    assert shapes["fc2.weight"] == (10, 50)
    frozen = build_model("mlp", (4,), 2, seed=0)
    frozen.net[1].weight.requires_grad_(False)
    assert [n for n, _, _ in param_spec(frozen)] == [
        "net.1.bias",
        "net.3.weight",
        "net.3.bias",
    ]


def test_cnn_mnist_outputs_log_probabilities() -> None:
    model = build_model("cnn_mnist", (1, 28, 28), 10, seed=0).eval()
    out = model(_batch("cnn_mnist", (1, 28, 28)))
    assert torch.allclose(out.exp().sum(dim=1), torch.ones(3), atol=1e-5)


def test_char_lstm_accepts_float_or_integer_indices() -> None:
    model = build_model("char_lstm", (10,), 80, seed=0, hidden_size=16).eval()
    x = _batch("char_lstm", (10,))
    assert torch.equal(model(x), model(x.long()))


def test_models_train_one_step() -> None:
    model = build_model("cnn", (1, 8, 8), 10, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch("cnn", (1, 8, 8), 8), torch.arange(8) % 10
    before = nn.functional.cross_entropy(model(x), y)
    before.backward()
    opt.step()
    after = nn.functional.cross_entropy(model(x), y)
    assert after.item() < before.item()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("resnet18", (3, 32, 32), 10), {}, "Unknown model: 'resnet18'.*mlp, cnn"),
        (
            ("mlp", (60,), 10),
            {"hidden": 5},
            r"Unknown option\(s\) \['hidden'\].*hidden_sizes",
        ),
        (("cnn_mnist", (1, 28, 28), 10), {"channels": [4]}, "allowed: none"),
        (("cnn", (64,), 10), {}, r"input_shape for 'cnn': \(64,\)"),
        (("cnn_mnist", (1, 8, 8), 10), {}, "at least 16x16"),
        (("char_lstm", (1, 80), 80), {}, "seq_len"),
        (("mlp", (), 10), {}, "Invalid input_shape"),
        (("mlp", (60,), 0), {}, "Invalid num_classes: 0"),
        (("mlp", (60,), 10), {"hidden_sizes": [0]}, "hidden_sizes entry: 0"),
        (("cnn", (1, 8, 8), 10), {"norm": "batch"}, "Invalid norm: 'batch'"),
        (("cnn", (1, 8, 8), 10), {"norm": "group", "groups": 5}, "does not divide"),
    ],
)
def test_build_model_errors(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(*args, seed=0, **kwargs)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_build_model_rejects_bad_seed(seed) -> None:
    with pytest.raises(ValueError, match="Invalid seed"):
        build_model("mlp", (60,), 10, seed=seed)


def test_registry_names() -> None:
    assert MODELS == ("mlp", "cnn", "cnn_mnist", "char_lstm")


@pytest.mark.parametrize(("name", "shape", "classes", "opts"), CASES, ids=IDS)
def test_weights_equal_torchs_to_empty_path(name, shape, classes, opts) -> None:
    """Materializing meta parameters by hand gives what ``to_empty`` + init gives, bit for bit."""
    from fedsim.models._build import _REGISTRY
    from fedsim.models._init import init_parameters

    with torch.device("meta"):
        ref = _REGISTRY[name](tuple(shape), classes, **opts)
    ref = init_parameters(ref.to_empty(device="cpu"), 4)
    ours = build_model(name, shape, classes, seed=4, **opts)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert a.device.type == "cpu", n
        assert a.requires_grad, n
        assert a.shape == b.shape, n
        assert a.stride() == b.stride(), n
        assert torch.equal(a, b), n
    x = _batch(name, shape)
    ours.eval()
    ref.eval()
    assert torch.equal(ours(x), ref(x))


def test_shared_parameter_stays_shared() -> None:
    """A plug-in model that ties two layers' weights keeps one tensor after it is built."""
    from fedsim.models import build_from

    class Tied(nn.Module):
        def __init__(self, shape, classes):  # type: ignore[no-untyped-def]
            super().__init__()
            self.a = nn.Linear(shape[0], shape[0], bias=False)
            self.b = nn.Linear(shape[0], shape[0], bias=False)
            self.b.weight = self.a.weight
            self.out = nn.Linear(shape[0], classes)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.out(self.b(self.a(x)))

    m = build_from(Tied, (5,), 3, seed=0)
    assert m.a.weight is m.b.weight
    assert m.a.weight.device.type == "cpu"
    assert len(list(m.parameters())) == 3


def test_building_a_model_does_not_import_sympy() -> None:
    """``to_empty`` would import torch's symbolic shapes and sympy (0.24 s of every start-up).

    (char_lstm still does: ``nn.Embedding``'s constructor draws its weights, and
    on the meta device that goes through torch's Python references, which
    import ``torch._dynamo``.)
    """
    code = ("import sys\nfrom fedsim.models import build_model\n"
            "build_model('mlp', (60,), 10, seed=0)\nbuild_model('cnn', (1, 8, 8), 10, seed=0)\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
