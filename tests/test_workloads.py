"""The workload registry: determinism, shapes, learning, evaluation, custom specs, errors."""

import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from torch.utils.data import Dataset, TensorDataset

from service.workloads import (
    BUILTIN_WORKLOADS,
    Workload,
    build_workload,
    check_workload,
    cross_entropy,
    evaluate,
    fetch_batch,
)

BUILTINS = sorted(BUILTIN_WORKLOADS)


@pytest.fixture(autouse=True)
def one_thread():
    # The machine is shared: keep each test on one core.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def built():
    """Each built-in once, seed 0 (builds are cheap, but sklearn's first import is not)."""
    return {name: build_workload(name, seed=0) for name in BUILTINS}


def test_registry_lists_the_three_builtins():
    assert set(BUILTIN_WORKLOADS) == {"mlp_digits", "cnn_digits", "char_lm"}
    for info in BUILTIN_WORKLOADS.values():
        assert info.description and "\n" not in info.description


@pytest.mark.parametrize("name", BUILTINS)
def test_same_seed_builds_identical_weights_and_data(name, built):
    a, b = built[name], build_workload(name, seed=0)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    for field in ("train_set", "eval_set"):
        for ta, tb in zip(getattr(a, field).tensors, getattr(b, field).tensors):
            assert torch.equal(ta, tb)


@pytest.mark.parametrize("name", BUILTINS)
def test_other_seed_builds_other_weights_on_the_same_split(name, built):
    a, c = built[name], build_workload(name, seed=1)
    weights_a = torch.cat([p.flatten() for p in a.model.parameters()])
    weights_c = torch.cat([p.flatten() for p in c.model.parameters()])
    assert not torch.equal(weights_a, weights_c)
    # The held-out split is fixed, so eval numbers stay comparable across seeds.
    assert torch.equal(a.eval_set.tensors[1], c.eval_set.tensors[1])


def test_build_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_workload("cnn_digits", seed=7)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", BUILTINS)
def test_shapes(name, built):
    wl, info = built[name], BUILTIN_WORKLOADS[name]
    x, y = fetch_batch(wl.train_set, torch.arange(5))
    assert tuple(x.shape) == (5, *info.input_shape)
    assert y.dtype == torch.long
    logits = wl.model(x)
    assert logits.shape == (*y.shape, info.num_classes)
    assert int(y.min()) >= 0 and int(y.max()) < info.num_classes
    assert len(wl.train_set) > len(wl.eval_set) > 0
    # Single items index like any Dataset too: (x, y) for one sample.
    x0, y0 = wl.train_set[0]
    assert tuple(x0.shape) == info.input_shape


def test_digits_split_covers_all_samples_and_classes(built):
    wl = built["mlp_digits"]
    assert len(wl.train_set) + len(wl.eval_set) == 1797
    assert set(wl.eval_set.tensors[1].tolist()) == set(range(10))


def test_char_lm_targets_are_the_next_byte_of_python_source(built):
    wl = built["char_lm"]
    x, y = wl.train_set.tensors
    assert torch.equal(y[:, :-1], x[:, 1:])  # y is x shifted by one
    assert torch.equal(y[:-1, -1], x[1:, 0])  # windows are consecutive text
    text = bytes(x[:2000].flatten().tolist())
    assert b"def " in text and b"import " in text
    ex, ey = wl.eval_set.tensors
    assert torch.equal(ey[:, :-1], ex[:, 1:])


@pytest.mark.parametrize("name", BUILTINS)
def test_a_few_sgd_steps_reduce_the_loss(name, built):
    wl = build_workload(name, seed=0)  # a fresh copy: training mutates the model
    x, y = fetch_batch(wl.train_set, torch.arange(32))
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    with torch.no_grad():
        before = float(wl.loss_fn(wl.model(x), y))
    for _ in range(15):
        loss = wl.loss_fn(wl.model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(wl.loss_fn(wl.model(x), y))
    assert after < before * 0.9, (before, after)


# -- evaluate and fetch_batch ------------------------------------------------------------


class FixedLogits(nn.Module):
    """Looks logits up by the (integer) input: lets evaluate be checked by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))
        self.seen_training = []

    def forward(self, x):
        self.seen_training.append(self.training)
        return self.table[x]


def test_evaluate_weights_every_position_over_uneven_batches():
    # 3 classes; inputs 0,1,2 predict class 0,1,2 with some confidence.
    model = FixedLogits([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])
    x = torch.tensor([[0, 1], [2, 0], [1, 1], [2, 2], [0, 2]])  # (5 sequences, 2 positions)
    y = torch.tensor([[0, 1], [2, 1], [1, 0], [2, 2], [0, 2]])  # 2 of 10 positions wrong
    model.train()
    loss, acc = evaluate(model, TensorDataset(x, y), cross_entropy, batch_size=2)
    with torch.no_grad():
        expected = float(cross_entropy(model.table[x], y))
    assert acc == pytest.approx(0.8)
    assert loss == pytest.approx(expected, rel=1e-6)
    assert model.seen_training and not any(model.seen_training)  # ran in eval mode
    assert model.training  # and restored train mode afterwards
    # The device argument moves each batch (checked on CPU: the machines here have no GPU).
    assert evaluate(model, TensorDataset(x, y), cross_entropy, batch_size=3, device="cpu") == (
        pytest.approx(expected, rel=1e-6), pytest.approx(0.8))


class ListDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_fetch_batch_same_for_tensor_and_plain_datasets():
    x, y = torch.randn(10, 4), torch.arange(10)
    idx = torch.tensor([7, 0, 3, 3])
    a = fetch_batch(TensorDataset(x, y), idx)
    b = fetch_batch(ListDataset(x, y), idx)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(a[0], x[idx])


# -- custom workloads ----------------------------------------------------------------------


def test_example_custom_workload_builds_and_learns():
    check_workload("examples.custom_workload:build")
    wl = build_workload("examples.custom_workload:build", seed=0)
    assert isinstance(wl, Workload)
    again = build_workload("examples.custom_workload:build", seed=0)
    for p, q in zip(wl.model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)
    _, acc_before = evaluate(wl.model, wl.eval_set, wl.loss_fn)
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    x, y = wl.train_set.tensors
    for _ in range(30):
        loss = wl.loss_fn(wl.model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, acc_after = evaluate(wl.model, wl.eval_set, wl.loss_fn)
    assert acc_after > 0.9 and acc_after > acc_before


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A throwaway package `userwl` on sys.path with a few modules good and bad."""
    pkg = tmp_path / "userwl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = {
        "good.py": """
            import torch
            from torch.utils.data import TensorDataset
            from service.workloads import Workload, cross_entropy

            NOT_CALLABLE = 3

            def build(seed):
                model = torch.nn.Linear(4, 3)
                data = TensorDataset(torch.randn(20, 4), torch.randint(0, 3, (20,)))
                return Workload(model, data, data, cross_entropy)

            def wrong_return(seed):
                return 42

            def not_a_module(seed):
                data = TensorDataset(torch.randn(20, 4), torch.randint(0, 3, (20,)))
                return ("model", data, data, cross_entropy)

            def explodes(seed):
                raise RuntimeError("called")
        """,
        "broken.py": """
            raise RuntimeError("line one\\nline two")
        """,
        "untouched.py": """
            raise AssertionError("a sibling module must never be imported")
        """,
    }
    for fname, body in files.items():
        (pkg / fname).write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userwl"
    for mod in [m for m in sys.modules if m == "userwl" or m.startswith("userwl.")]:
        del sys.modules[mod]


def test_custom_spec_returning_a_workload(user_package):
    wl = build_workload("userwl.good:build", seed=3)
    assert isinstance(wl.model, nn.Linear)
    assert torch.equal(wl.model.weight, build_workload("userwl.good:build", seed=3).model.weight)
    assert not torch.equal(wl.model.weight, build_workload("userwl.good:build", seed=4).model.weight)


def test_check_imports_only_the_named_module_and_does_not_call(user_package):
    check_workload("userwl.good:explodes")  # not called, so no RuntimeError
    assert "userwl.good" in sys.modules
    assert "userwl.untouched" not in sys.modules


def one_line_error(fn, *args) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message and message
    return message


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ("resnet50", ["unknown workload 'resnet50'", "mlp_digits", "cnn_digits", "char_lm", "module:function"]),
        ("mlp_digit", ["unknown workload 'mlp_digit'", "(did you mean 'mlp_digits'?)"]),
        ("", ["mlp_digits", "module:function"]),
        ("userwl.good:", ["bad workload spec", "package.module:function"]),
        ("userwl good:build", ["bad workload spec"]),
        ("a:b:c", ["bad workload spec"]),
        ("no_such_pkg_xyz.mod:build", ["cannot import no_such_pkg_xyz.mod", "ModuleNotFoundError"]),
        ("userwl.broken:build", ["cannot import userwl.broken", "RuntimeError: line one line two"]),
        ("userwl.good:missing", ["has no attribute 'missing'"]),
        ("userwl.good:NOT_CALLABLE", ["userwl.good.NOT_CALLABLE is not callable"]),
    ],
)
def test_bad_names_fail_check_and_build_with_one_line(user_package, spec, fragments):
    for fn in (check_workload, lambda name: build_workload(name, 0)):
        message = one_line_error(fn, spec)
        for fragment in fragments:
            assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("userwl.good:wrong_return", "returned int; expected a Workload or a (model, train_set, eval_set, loss_fn) tuple"),
        ("userwl.good:not_a_module", "model is str, not a torch.nn.Module"),
    ],
)
def test_bad_return_values_fail_build_with_one_line(user_package, spec, fragment):
    check_workload(spec)  # cheap check cannot see the return value
    assert fragment in one_line_error(build_workload, spec, 0)


def test_check_accepts_every_builtin():
    for name in BUILTINS:
        check_workload(name)


def test_the_digits_are_scikit_learns_without_importing_it():
    """service.workloads.digits.load_digits reads scikit-learn's data file as load_digits() does,
    in a process that never imports sklearn (every rank of every digits trial saves the import)."""
    import subprocess
    import tempfile

    code = ("import sys, torch; from service.workloads.digits import load_digits; x, y = load_digits(); "
            "assert 'sklearn' not in sys.modules; torch.save((x, y), sys.argv[1])")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", code, f"{tmp}/d.pt"], check=True, timeout=120)
        x, y = torch.load(f"{tmp}/d.pt")
    from sklearn.datasets import load_digits as sklearn_digits

    ref = sklearn_digits()
    assert torch.equal(x, torch.tensor(ref.data, dtype=torch.float32))
    assert torch.equal(y, torch.tensor(ref.target, dtype=torch.long))
    assert x.shape == (1797, 64) and y.dtype == torch.long
