"""The executor running hand-written plans, against torch autograd + torch.optim.SGD on the same weights."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from edgetrain.runtime.python import (Ledger, LedgerError, PageStoreError, PlanError, Runtime, dropout_apply, dropout_mask, load_plan, runtime_for)
from edgetrain.runtime.python.storage import FileStore

B, D, H, C = 4, 6, 5, 3
LR, MOM, WD = 0.1, 0.9, 5e-4


def mlp_train_step(rt, hook=None):
    """input, fc1, relu1, fc2, labels, loss, loss_bwd, fc2_bwd, relu1_bwd, fc1_bwd; relu1 is recomputed and
    the input is paged out after fc1 and back in for fc1's weight gradient."""
    fc1 = {"bias": True}
    rt.load_input()
    rt.compute("fc1", "linear", ["input"], params=["fc1.weight", "fc1.bias"], attrs=fc1)
    rt.page_out("input")
    rt.free("input")
    rt.compute("relu1", "relu", ["fc1"])
    rt.compute("fc2", "linear", ["relu1"], params=["fc2.weight", "fc2.bias"], attrs=fc1)
    rt.free("relu1")
    rt.load_labels()
    rt.compute("loss", "cross_entropy", ["fc2", "labels"])
    rt.compute("loss_bwd", "cross_entropy_bwd", ["fc2", "labels"], attrs={"input_shape": [B, C],
                                                                        "needs_input_grad": True})
    for t in ("loss", "fc2", "labels"):
        rt.free(t)
    rt.recompute("relu1", "relu", ["fc1"])
    rt.free("fc1")
    rt.compute("fc2_bwd", "linear_bwd", ["loss_bwd", "relu1"], params=["fc2.weight", "fc2.bias"],
               attrs={"bias": True, "input_shape": [B, H], "needs_input_grad": True})
    rt.free("loss_bwd")
    rt.compute("relu1_bwd", "relu_bwd", ["fc2_bwd", "relu1"], attrs={"input_shape": [B, H],
                                                                   "needs_input_grad": True})
    rt.free("fc2_bwd")
    rt.free("relu1")
    if hook:
        hook(rt)
    rt.page_in("input")
    rt.compute("fc1_bwd", "linear_bwd", ["relu1_bwd", "input"], params=["fc1.weight", "fc1.bias"],
               attrs={"bias": True, "input_shape": [B, D], "needs_input_grad": False})
    rt.free("relu1_bwd")
    rt.free("input")


def make_mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, C))


def save_weights(model, path, names=None):
    names = names or {}
    t = {f"param/{names.get(k, k)}": v.detach().clone() for k, v in model.named_parameters()}
    t.update({f"buffer/{names.get(k, k)}": v.detach().clone() for k, v in model.named_buffers()})
    save_file(t, str(path))
    return path


MLP_NAMES = {"0.weight": "fc1.weight", "0.bias": "fc1.bias", "2.weight": "fc2.weight", "2.bias": "fc2.bias"}


def batches(n):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g)) for _ in range(n)]


@pytest.fixture
def mlp_rt(tmp_path):
    model = make_mlp()
    rt = Runtime(save_weights(model, tmp_path / "w.safetensors", MLP_NAMES), tmp_path / "pages", device="cpu",
                 lr=LR, momentum=MOM, weight_decay=WD)
    return model, rt


def test_mlp_plan_matches_autograd_and_sgd(mlp_rt):
    model, rt = mlp_rt
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM, weight_decay=WD, foreach=False)
    for step, (x, y) in enumerate(batches(2)):
        opt.zero_grad()
        ref_loss = F.cross_entropy(model(x), y)
        ref_loss.backward()
        opt.step()
        rt.begin_step(x, y)
        mlp_train_step(rt)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss = rt.end_step()
        assert loss == ref_loss.item() == rt.losses[step]
        assert rt.leftovers == []
        for k, p in model.named_parameters():
            assert torch.equal(rt.params[MLP_NAMES[k]], p.detach()), k
            assert torch.equal(rt.momentum_buffers[MLP_NAMES[k]], opt.state[p]["momentum_buffer"]), k
    assert len(rt.losses) == 2


def test_mlp_ledger_peak_by_hand(mlp_rt):
    _, rt = mlp_rt
    f = 4  # bytes per float32
    params = (H * D + H + C * H + C) * f  # 212
    state = 2 * params  # parameters + momentum buffers: 424
    assert rt.ledger.live_bytes == rt.ledger.peak_bytes == state
    for x, y in batches(2):
        rt.begin_step(x, y)
        mlp_train_step(rt)
        rt.end_step()
        assert rt.ledger.live_bytes == state
    # The peak is fc1_bwd: state + paged-in input + relu1_bwd + fc1's weight and bias gradients (transient).
    # (fc2_bwd reaches state + relu1 + loss_bwd + fc2_bwd + fc2's grads = 424 + 80 + 48 + 80 + 72 = 704.)
    assert rt.ledger.peak_bytes == state + B * D * f + B * H * f + (H * D + H) * f == 740
    assert rt.ledger.peak_at == "fc1_bwd (grads+scratch)"
    assert rt.paged_bytes == 2 * 2 * B * D * f  # out and in, each step
    assert rt.cuda_max_memory_allocated is None


def test_corrupted_page_file_raises(mlp_rt):
    _, rt = mlp_rt
    x, y = batches(1)[0]

    def corrupt(rt):
        rt.store.wait("input")  # the background write done, then a bit flipped on the medium
        path = rt.store.path_of("input")
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x40  # flip one bit of the last float's bytes
        path.write_bytes(bytes(raw))

    rt.begin_step(x, y)
    with pytest.raises(PageStoreError, match=r"'input'.*checksum mismatch in .*\.page"):
        mlp_train_step(rt, hook=corrupt)


def test_page_store_missing_and_damaged_files(tmp_path):
    store = FileStore(tmp_path)
    t = torch.randn(3, 4)
    with pytest.raises(PageStoreError, match=r"'a/b.c'.*file .*a_b\.c-\w+\.page is missing"):
        store.page_in("a/b.c")
    path = store.page_out("a/b.c", t)
    store.wait()
    assert path.parent == tmp_path and path.suffix == ".page"
    assert torch.equal(store.page_in("a/b.c"), t)
    assert store.bytes_out == store.bytes_in == 48
    good = path.read_bytes()
    path.write_bytes(good[:-3])  # a torn write
    with pytest.raises(PageStoreError, match="'a/b.c'.*unreadable.*45 data bytes for 48 expected"):
        store.page_in("a/b.c")
    path.write_bytes(good + b"\0")
    with pytest.raises(PageStoreError, match="'a/b.c'.*unreadable"):
        store.page_in("a/b.c")
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(PageStoreError, match="'a/b.c'.*unreadable.*bad magic"):
        store.page_in("a/b.c")
    store.page_out("other", torch.zeros(3, 4))
    store.wait("other")
    path.write_bytes(store.path_of("other").read_bytes())  # a valid file holding another tensor
    with pytest.raises(PageStoreError, match="holds 'other'"):
        store.page_in("a/b.c")
    assert b"pickle" not in path.read_bytes()


def test_page_store_catches_every_single_bit_flip(tmp_path):
    """A flipped bit anywhere in a page file (prefix, header or data) is refused, never read as a tensor."""
    store = FileStore(tmp_path)
    t = torch.randn(2, 3, 5)
    path = store.page_out("x", t)
    store.wait("x")
    good = path.read_bytes()
    positions = list(range(len(good) - 2 * t.numel() * 4, len(good), 7))  # spread over the data
    positions += list(range(0, len(good) - t.numel() * 4, 3))  # and over prefix and header
    for pos in positions:
        for bit in (0, 5):
            raw = bytearray(good)
            raw[pos] ^= 1 << bit
            path.write_bytes(bytes(raw))
            with pytest.raises(PageStoreError, match="'x'"):
                store.page_in("x")
    path.write_bytes(good)
    assert torch.equal(store.page_in("x"), t)


def test_background_page_out_returns_at_once_and_lets_go_on_wait(tmp_path, monkeypatch):
    """A page-out is written by the background writer while the caller goes on; wait() returns once it is
    written and the writer holds no reference to the tensor (so freeing it then frees its bytes)."""
    import time

    from torch.multiprocessing.reductions import StorageWeakRef

    from edgetrain.runtime.python import storage

    real = storage._write

    def slow_write(*args):
        time.sleep(0.3)
        return real(*args)

    monkeypatch.setattr(storage, "_write", slow_write)
    store = FileStore(tmp_path)
    t = torch.randn(1000)
    want, ref = t.clone(), StorageWeakRef(t.untyped_storage())  # the bytes, not the Python object
    start = time.perf_counter()
    path = store.page_out("t", t)
    assert time.perf_counter() - start < 0.2  # returned before the write
    del t
    assert not ref.expired()  # the write in flight still holds the bytes
    store.wait("t")
    assert ref.expired()  # written, and no reference left anywhere: the bytes are freed
    assert torch.equal(store.page_in("t"), want)
    sync = FileStore(tmp_path / "sync", background=False)
    sync.page_out("t", want)
    assert torch.equal(sync.page_in("t"), want)


def test_a_failed_background_write_raises_at_wait_naming_the_file(tmp_path, monkeypatch):
    from edgetrain.runtime.python import storage

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "_write", full)
    store = FileStore(tmp_path)
    store.page_out("x", torch.zeros(4))
    with pytest.raises(PageStoreError, match=r"page-out of 'x': writing .*x-\w+\.page failed \(No space left"):
        store.wait("x")


def test_runtime_free_waits_for_the_page_out(mlp_rt, monkeypatch):
    """The plan frees a paged-out tensor while its write may be in flight: free waits, so the bytes go when
    the ledger releases them, and the step stays exact."""
    import time

    from edgetrain.runtime.python import storage

    real, done = storage._write, []

    def slow_write(*args):
        time.sleep(0.2)
        crc = real(*args)
        done.append(time.perf_counter())
        return crc

    monkeypatch.setattr(storage, "_write", slow_write)
    _, rt = mlp_rt
    x, y = batches(1)[0]
    freed = []
    real_release = rt.ledger.release

    def release(name):
        if name == "input":
            freed.append(time.perf_counter())
        return real_release(name)

    monkeypatch.setattr(rt.ledger, "release", release)
    rt.begin_step(x, y)
    mlp_train_step(rt)
    assert done and freed and done[0] <= freed[0]  # written before its first free


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_page_store_round_trips_dtypes_and_shapes(tmp_path, dtype):
    store = FileStore(tmp_path)
    for shape in [(), (0,), (7,), (2, 3, 4)]:
        t = (torch.randn(shape) * 100).to(dtype)
        store.page_out("t", t)
        back = store.page_in("t")
        assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_plan_errors_name_tensor_and_step(mlp_rt):
    _, rt = mlp_rt
    x, y = batches(1)[0]
    with pytest.raises(PlanError, match="outside begin_step"):
        rt.load_input()
    rt.begin_step(x, y)
    rt.load_input()
    rt.compute("fc1", "linear", ["input"], params=["fc1.weight", "fc1.bias"], attrs={"bias": True})
    rt.free("input")
    with pytest.raises(PlanError, match=r"step 0, op #4 compute 'relu0'.*'input' is not resident \(freed at op #3\)"):
        rt.compute("relu0", "relu", ["input"])
    with pytest.raises(PlanError, match="'nope' is not resident.*never computed"):
        rt.compute("relu1", "relu", ["nope"])
    with pytest.raises(PlanError, match="'fc1' is already resident"):
        rt.compute("fc1", "linear", ["fc1"], params=["fc1.weight", "fc1.bias"], attrs={"bias": True})
    with pytest.raises(PlanError, match="'input' was not paged out"):
        rt.page_in("input")
    with pytest.raises(PlanError, match="no kernel named 'silu'"):
        rt.compute("g", "silu", ["fc1"])
    with pytest.raises(PlanError, match="unknown parameter 'fc9.weight'"):
        rt.compute("h", "linear", ["fc1"], params=["fc9.weight"], attrs={"bias": False})
    with pytest.raises(PlanError, match="'fc1.aux' is not resident"):
        rt.compute("h", "relu", ["fc1"], aux_of="fc1")
    with pytest.warns(RuntimeWarning, match="left 1 tensors resident: fc1"):
        rt.end_step()
    assert rt.leftovers == ["fc1"] and rt.step == 1


def test_views_cost_nothing(mlp_rt):
    _, rt = mlp_rt
    x, y = batches(1)[0]
    rt.begin_step(x, y)
    rt.load_input()
    live = rt.ledger.live_bytes
    rt.compute("r", "relu", [{"t": "input", "view": [["reshape", [2, 2, D]], ["narrow", 1, 1, 1],
                                                     ["reshape", [2, D]]]}])
    assert rt.ledger.live_bytes == live + 2 * D * 4
    assert torch.equal(rt.tensor("r"), F.relu(x.view(2, 2, D)[:, 1]))
    for t in ("r", "input"):
        rt.free(t)
    assert rt.end_step() is None


def test_ledger_rules():
    led = Ledger()
    led.alloc("a", 10)
    with pytest.raises(LedgerError):
        led.alloc("a", 1)
    with pytest.raises(LedgerError):
        led.release("b")
    with led.transient(7):
        assert led.live_bytes == 17
    assert led.live_bytes == 10 and led.peak_bytes == 17
    assert led.release("a") == 10 and led.live_bytes == 0


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 3 * 3, C)

    def forward(self, x, mask, p):
        z = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2, ceil_mode=True)
        return self.fc(dropout_apply(z, mask, p).flatten(1))


CONV = {"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
        "bias": False}
POOL = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "ceil_mode": True}
P = 0.25


def convnet_step(rt):
    """conv, bn, relu, maxpool (argmax + gather), dropout, linear, cross-entropy; bn, relu, gather and
    dropout are recomputed in backward (bn twice: the running stats must move once)."""
    xs, bs = [2, 3, 5, 5], [2, 4, 5, 5]
    bn = dict(params=["bn.weight", "bn.bias"], buffers=["bn.running_mean", "bn.running_var",
                                                       "bn.num_batches_tracked"], attrs={"eps": 1e-5, "momentum": 0.1})
    drop = {"p": P, "seed_id": 1}
    flat = {"t": "drop", "view": [["reshape", [2, 36]]]}
    rt.load_input()
    rt.compute("conv", "conv2d", ["input"], params=["conv.weight"], attrs=CONV)
    rt.compute("bn", "batch_norm", ["conv"], **bn)
    rt.compute("relu", "relu", ["bn"])
    rt.free("bn")
    rt.compute("idx", "maxpool_argmax", ["relu"], attrs=POOL)
    rt.compute("pool", "maxpool_gather", ["relu", "idx"])
    rt.free("relu")
    rt.compute("drop", "dropout", ["pool"], attrs=drop)
    rt.free("pool")
    rt.compute("fc", "linear", [flat], params=["fc.weight", "fc.bias"], attrs={"bias": True})
    rt.free("drop")
    rt.load_labels()
    rt.compute("loss", "cross_entropy", ["fc", "labels"])
    rt.compute("g_fc", "cross_entropy_bwd", ["fc", "labels"], attrs={"input_shape": [2, C]})
    for t in ("loss", "fc", "labels"):
        rt.free(t)
    rt.recompute("bn", "batch_norm", ["conv"], **bn)  # recompute the chain up to drop
    rt.recompute("relu", "relu", ["bn"])
    rt.free("bn")
    rt.recompute("pool", "maxpool_gather", ["relu", "idx"])
    rt.recompute("drop", "dropout", ["pool"], attrs=drop)
    rt.free("pool")
    rt.compute("g_drop", "linear_bwd", ["g_fc", flat], params=["fc.weight", "fc.bias"],
               attrs={"bias": True, "input_shape": [2, 36], "needs_input_grad": True})
    for t in ("g_fc", "drop"):
        rt.free(t)
    rt.compute("g_pool", "dropout_bwd", [{"t": "g_drop", "view": [["reshape", [2, 4, 3, 3]]]}],
               attrs={**drop, "input_shape": [2, 4, 3, 3]})
    rt.free("g_drop")
    rt.compute("g_relu", "maxpool_bwd", ["g_pool", "idx"], attrs={**POOL, "input_shape": bs})
    for t in ("g_pool", "idx"):
        rt.free(t)
    rt.compute("g_bn", "relu_bwd", ["g_relu", "relu"], attrs={"input_shape": bs})
    for t in ("g_relu", "relu"):
        rt.free(t)
    rt.compute("g_conv", "batch_norm_bwd", ["g_bn", "conv"], params=bn["params"], aux_of="bn",
               attrs={**bn["attrs"], "input_shape": bs, "needs_input_grad": True})
    for t in ("g_bn", "conv", "bn.aux"):
        rt.free(t)
    rt.compute("g_x", "conv2d_bwd", ["g_conv", "input"], params=["conv.weight"],
               attrs={**CONV, "input_shape": xs, "needs_input_grad": False})
    for t in ("g_conv", "input"):
        rt.free(t)


def test_convnet_plan_with_bn_dropout_maxpool_recompute(tmp_path):
    torch.manual_seed(3)
    model = ConvNet().train()
    rt = Runtime(save_weights(model, tmp_path / "w.safetensors"), tmp_path / "pages", device="cpu",
                 lr=LR, momentum=MOM, weight_decay=WD, seed=9)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM, weight_decay=WD, foreach=False)
    g = torch.Generator().manual_seed(2)
    for step in range(3):
        x = torch.randn(2, 3, 5, 5, generator=g).round()  # rounded: ties in max-pool windows
        y = torch.randint(0, C, (2,), generator=g)
        opt.zero_grad()
        mask = dropout_mask((2, 4, 3, 3), P, seed=9, step=step, seed_id=1, device="cpu")
        ref = F.cross_entropy(model(x, mask, P), y)
        ref.backward()
        opt.step()
        rt.begin_step(x, y)
        convnet_step(rt)
        assert rt.end_step() == ref.item()
        assert rt.leftovers == []
        for k, p in model.named_parameters():
            assert torch.equal(rt.params[k], p.detach()), (step, k)
        for k, b in model.named_buffers():
            assert torch.equal(rt.buffers[k], b), (step, k)
    assert rt.buffers["bn.num_batches_tracked"].item() == 3


def test_load_plan(tmp_path):
    model = make_mlp()
    save_weights(model, tmp_path / "weights.safetensors", MLP_NAMES)
    (tmp_path / "plan.py").write_text(
        "PLAN = {'weights': 'weights.safetensors', 'optimizer': {'lr': 0.1, 'momentum': 0.9, "
        "'weight_decay': 0.0005}, 'seed': 0}\n"
        "def train_step(rt):\n"
        "    rt.load_input()\n"
        "    rt.compute('fc1', 'linear', ['input'], params=['fc1.weight', 'fc1.bias'], attrs={'bias': True})\n"
        "    rt.free('input')\n    rt.free('fc1')\n")
    plan = load_plan(tmp_path)
    rt = runtime_for(plan, storage_dir=tmp_path / "pages", device="cpu")
    x, y = batches(1)[0]
    rt.begin_step(x, y)
    plan.train_step(rt)
    rt.end_step()
    assert rt.leftovers == [] and rt.lr == 0.1
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "plan.py").write_text("PLAN = {'weights': 'w'}\ndef train_step(rt): pass\n")
    with pytest.raises(PlanError, match="lacks optimizer, seed"):
        load_plan(tmp_path / "bad")
