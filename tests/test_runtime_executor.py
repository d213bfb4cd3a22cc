"""The executor running a hand-written plan of aten ops, against torch autograd + torch.optim.SGD on the same
weights."""
from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from edgetrain.runtime.python import Ledger, LedgerError, PageStoreError, PlanError, Runtime, load_plan, runtime_for
from edgetrain.runtime.python import storage
from edgetrain.runtime.python.storage import FileStore

B, D, H, C = 4, 6, 5, 3
LR, MOM, WD = 0.1, 0.9, 5e-4


ADDMM, MM, RELU, SUM = "aten.addmm.default", "aten.mm.default", "aten.relu.default", "aten.sum.dim_IntList"
TR = [["aten.t.default", []]]


def T(k: int) -> dict:
    return {"$t": k}


def P(name: str, view=None) -> dict:
    return {"$p": name, **({"view": view} if view else {})}


def linear(layer: str) -> dict:
    return {"args": [P(f"{layer}.bias"), T(0), P(f"{layer}.weight", TR)]}


def linear_backward(layer: str, needs_input_grad: bool) -> tuple[list, dict]:
    """Operands (grad, its transpose, the layer's input) and attrs: the input gradient first (it reads the
    weight before the update), then the weight and bias gradients, each applied at once."""
    then = [{"op": MM, "args": [T(1), T(2)], "keep": "none", "updates": [{"item": None, "param": f"{layer}.weight"}]},
            {"op": SUM, "args": [T(0), [0]], "keep": "none", "updates": [{"item": None, "param": f"{layer}.bias"}]}]
    if needs_input_grad:
        return {"args": [T(0), P(f"{layer}.weight")], "then": then}
    return {**then[0], "then": then[1:]}


def mlp_train_step(rt, hook=None):
    """input, fc1, relu1, fc2, log-softmax, labels, nll loss, then the backward: relu1 is recomputed and the
    input is paged out after fc1 and back in for fc1's weight gradient."""
    rt.load_input()
    rt.compute("fc1", ADDMM, ["input"], params=["fc1.weight", "fc1.bias"], attrs=linear("fc1"))
    rt.page_out("input")
    rt.free("input")
    rt.compute("relu1", RELU, ["fc1"], attrs={"args": [T(0)]})
    rt.compute("fc2", ADDMM, ["relu1"], params=["fc2.weight", "fc2.bias"], attrs=linear("fc2"))
    rt.free("relu1")
    rt.compute("logp", "aten._log_softmax.default", ["fc2"], attrs={"args": [T(0), 1, False]})
    rt.free("fc2")
    rt.load_labels()
    rt.compute("loss", "aten.nll_loss_forward.default", ["logp", "labels"],
               attrs={"args": [T(0), T(1), None, 1, -100], "keep": [0, 1], "loss_item": 0})
    loss, total = ({"t": "loss", "view": [["item", k]]} for k in (0, 1))
    rt.compute("ones", "aten.ones_like.default", [loss], attrs={"args": [T(0)]})
    rt.compute("g_logp", "aten.nll_loss_backward.default", ["ones", "logp", "labels", total],
               attrs={"args": [T(0), T(1), T(2), None, 1, -100, T(3)]})
    for t in ("ones", "loss", "labels"):
        rt.free(t)
    rt.compute("g_fc2", "aten._log_softmax_backward_data.default", ["g_logp", "logp"],
               attrs={"args": [T(0), T(1), 1, {"$dtype": "float32"}]})
    for t in ("g_logp", "logp"):
        rt.free(t)
    rt.recompute("relu1", RELU, ["fc1"], attrs={"args": [T(0)]})
    rt.free("fc1")
    rt.compute("g_relu1", MM, ["g_fc2", {"t": "g_fc2", "view": TR}, "relu1"], params=["fc2.weight"],
               attrs=linear_backward("fc2", True))
    rt.free("g_fc2")
    rt.compute("g_fc1", "aten.threshold_backward.default", ["g_relu1", "relu1"], attrs={"args": [T(0), T(1), 0]})
    rt.free("g_relu1")
    rt.free("relu1")
    if hook:
        hook(rt)
    rt.page_in("input")
    rt.compute("fc1_bwd", MM, ["g_fc1", {"t": "g_fc1", "view": TR}, "input"], attrs=linear_backward("fc1", False))
    rt.free("g_fc1")
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
    # The peak is fc1_bwd: state + paged-in input + g_fc1 + fc1's weight gradient (transient: applied at once,
    # before the bias gradient is made). (g_relu1 reaches 424 + g_fc2 48 + relu1 80 + g_relu1 80 + 60 = 692.)
    assert rt.ledger.peak_bytes == state + B * D * f + B * H * f + H * D * f == 720
    assert rt.ledger.peak_at == "fc1_bwd (dropped outputs)"
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


def test_page_in_of_own_page_touches_no_file_until_read(tmp_path):
    """A page-in of a tensor this store paged out allocates it from what was written, without opening the file
    on the calling thread; the reader finds a missing or swapped file and result() names it."""
    store = FileStore(tmp_path)
    store.page_out("a", torch.randn(3, 4))
    store.page_out("b", torch.randn(2, 2))
    store.wait()
    store.path_of("a").unlink()
    pending = store.start_page_in("a")  # no error yet: the file is first opened on the reader thread
    assert pending.nbytes == 48
    with pytest.raises(PageStoreError, match=r"'a'.*file .*a-\w+\.page is missing"):
        pending.result()
    store.path_of("a").write_bytes(store.path_of("b").read_bytes())  # another tensor's valid file, other shape
    with pytest.raises(PageStoreError, match=r"'a'.*holds 'b', a float32\[2, 2\] tensor, not the float32\[3, 4\]"):
        store.page_in("a")


@pytest.mark.parametrize("algorithm", ["xxh3_64", "crc32"])
def test_page_store_catches_every_single_bit_flip(tmp_path, monkeypatch, algorithm):
    """A flipped bit anywhere in a page file (prefix, header or data) is refused, never read as a tensor, with
    XXH3-64 and with the CRC-32 a runtime without xxhash writes."""
    monkeypatch.setattr(storage, "CHECKSUM", algorithm)
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


def test_a_page_names_its_checksum_and_is_read_by_it(tmp_path, monkeypatch):
    """Each page file says which checksum it carries: a CRC-32 page reads back in a store that writes XXH3-64,
    and a checksum this runtime cannot compute is refused by name."""
    t = torch.randn(4, 5)
    monkeypatch.setattr(storage, "CHECKSUM", "crc32")
    writer = FileStore(tmp_path)
    path = writer.page_out("w", t)
    writer.wait()
    monkeypatch.setattr(storage, "CHECKSUM", "xxh3_64")
    store = FileStore(tmp_path)
    raw = path.read_bytes()
    assert b'"checksum":"crc32"' in raw
    assert torch.equal(store.page_in("w"), t)  # a file this store did not write: its header says how to check it
    path.write_bytes(raw.replace(b'"checksum":"crc32"', b'"checksum":"md4xx"'))
    with pytest.raises(PageStoreError, match=r"'w'.*checksum 'md4xx' is not available"):
        store.page_in("w")


def test_own_page_is_read_in_one_system_call_and_checked_as_written(tmp_path, monkeypatch):
    """A page this store wrote comes back in one preadv (prefix, header, bytes and one byte beyond), checked
    against what was written; the careful reader runs only when something differs, and names it."""
    from edgetrain.runtime.python import storage

    calls, careful = [], []
    real_preadv, real_read = os.preadv, storage._read
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at: calls.append(len(bufs)) or real_preadv(fd, bufs, at))
    monkeypatch.setattr(storage, "_read", lambda *a: careful.append(a[0]) or real_read(*a))
    store = FileStore(tmp_path, background=False)
    t = torch.randn(64, 33)
    path = store.page_out("t", t)
    assert torch.equal(store.page_in("t"), t) and calls == [3] and careful == []
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(PageStoreError, match="'t'.*checksum mismatch"):
        store.page_in("t")
    assert careful == ["t"]


def test_background_page_out_returns_at_once_and_lets_go_on_wait(tmp_path, monkeypatch):
    """A page-out is written by the background writer while the caller goes on; wait() returns once it is
    written and the writer holds no reference to the tensor (so freeing it then frees its bytes)."""
    import threading

    from torch.multiprocessing.reductions import StorageWeakRef

    from edgetrain.runtime.python import storage

    real, go, written = storage._write, threading.Event(), []

    def held_write(*args):  # the write waits for the test's word, however long the caller takes meanwhile
        go.wait(10)
        crc = real(*args)
        written.append(True)
        return crc

    monkeypatch.setattr(storage, "_write", held_write)
    store = FileStore(tmp_path, inline_below=0)  # every page on the threads, however small
    t = torch.randn(1000)
    want, ref = t.clone(), StorageWeakRef(t.untyped_storage())  # the bytes, not the Python object
    store.page_out("t", t)
    assert not written  # returned before the write
    del t
    assert not ref.expired()  # the write in flight still holds the bytes
    go.set()
    store.wait("t")
    assert ref.expired()  # written, and no reference left anywhere: the bytes are freed
    assert torch.equal(store.page_in("t"), want)
    sync = FileStore(tmp_path / "sync", background=False)
    sync.page_out("t", want)
    assert torch.equal(sync.page_in("t"), want)


def test_wait_for_a_queued_write_does_it_instead_of_standing_still(tmp_path, monkeypatch):
    """A write the writer thread has not started yet is done by the thread that waits for it: a free never waits
    behind the writes queued before it (here a slow one), and both files are right."""
    import threading

    from edgetrain.runtime.python import storage

    real, release, who = storage._write, threading.Event(), {}

    def write(path, *rest):
        who[path.name] = threading.current_thread().name
        if path.name.startswith("slow"):
            release.wait(5)
        return real(path, *rest)

    monkeypatch.setattr(storage, "_write", write)
    store = FileStore(tmp_path, inline_below=0)
    a, b = torch.randn(5), torch.randn(7)
    store.page_out("slow", a)
    store.page_out("next", b)
    store.wait("next")  # queued behind "slow", which holds the writer (for 5 s, were it left to the writer)
    assert who[store.path_of("next").name] == threading.current_thread().name
    release.set()
    store.wait()
    assert torch.equal(store.page_in("slow"), a) and torch.equal(store.page_in("next"), b)


def test_small_pages_skip_the_threads_large_ones_use_them(tmp_path, monkeypatch):
    """A page below `inline_below` bytes is written, and read and checked, on the calling thread at once (no
    job left for a thread); one at or above it goes to the writer and reader threads. Both come back exact."""
    import threading
    import time

    from edgetrain.runtime.python import storage

    where = []

    def logged(what, real):
        def run(*args):
            where.append((what, threading.current_thread().name))
            return real(*args)
        return run

    monkeypatch.setattr(storage, "_write", logged("write", storage._write))
    for reader in ("_read", "_read_own"):  # a page of another store's, and this store's own
        monkeypatch.setattr(storage, reader, logged("read", getattr(storage, reader)))
    assert FileStore(tmp_path / "default").inline_below is None  # the size follows the cores: test below
    store = FileStore(tmp_path, inline_below=400)
    small, large = torch.randn(99), torch.randn(100)  # 396 and 400 bytes
    me = threading.current_thread().name
    store.page_out("small", small)
    assert where == [("write", me)] and not store.writing("small")  # written already, nothing pending
    pending = store.start_page_in("small")
    assert where[-1] == ("read", me)  # read and checked already
    assert torch.equal(pending.result(), small)
    where.clear()

    def picked_up(k):  # a job is left to its thread (a waiting caller would run a job not started yet itself)
        deadline = time.monotonic() + 10
        while len(where) < k and time.monotonic() < deadline:
            time.sleep(0.001)

    store.page_out("large", large)
    assert store.writing("large")
    picked_up(1)
    store.wait("large")
    pending = store.start_page_in("large")
    picked_up(2)
    assert torch.equal(pending.result(), large)
    assert [w for w, _ in where] == ["write", "read"] and all(n != me for _, n in where)  # on the store's threads
    inline = FileStore(tmp_path / "inline", background=False, inline_below=0)  # no threads: everything here
    where.clear()
    inline.page_out("large", large)
    assert torch.equal(inline.page_in("large"), large) and all(n == me for _, n in where)


@pytest.mark.parametrize("cpus, threads, inline", [(4, 4, True), (4, 8, True), (4, 3, False), (2, 1, False)])
def test_small_pages_go_to_the_threads_only_where_the_compute_threads_leave_a_core(tmp_path, monkeypatch, cpus,
                                                                                   threads, inline):
    """A page between the two sizes stays on the calling thread while torch's threads take every core the process
    may use, and goes to the store's threads when one is left; the count is read at each page (a plan pins its own
    while its step runs)."""
    import threading
    import time

    assert 0 < storage.INLINE_PAGE_BYTES_FREE_CORE < storage.INLINE_PAGE_BYTES
    monkeypatch.setattr(storage, "USABLE_CPUS", cpus)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    where = []
    real = storage._write
    monkeypatch.setattr(storage, "_write", lambda *a: where.append(threading.current_thread().name) or real(*a))
    store = FileStore(tmp_path)
    mid = torch.randn(storage.INLINE_PAGE_BYTES_FREE_CORE // 4)  # exactly the lower size
    store.page_out("mid", mid)
    deadline = time.monotonic() + 10
    while not where and time.monotonic() < deadline:  # left to the writer (a wait would run it here itself)
        time.sleep(0.001)
    store.wait("mid")
    assert (where == [threading.current_thread().name]) is inline
    assert torch.equal(store.page_in("mid"), mid)
    where.clear()
    store.page_out("below", torch.randn(storage.INLINE_PAGE_BYTES_FREE_CORE // 4 - 1))
    store.wait("below")
    assert where == [threading.current_thread().name]  # below the lower size: on the calling thread either way


def test_a_failed_background_write_raises_at_wait_naming_the_file(tmp_path, monkeypatch):
    from edgetrain.runtime.python import storage

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage, "_write", full)
    store = FileStore(tmp_path, inline_below=0)
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


def test_page_in_reads_ahead_counted_at_once_and_verified_at_use(mlp_rt, monkeypatch):
    """rt.page_in allocates and counts the tensor at once and returns while the reader thread fills it; the
    first use waits for the bytes and their checksum, so a corrupted page is refused there, naming it, and a
    page read ahead but freed unused is verified too."""
    import threading

    from edgetrain.runtime.python import storage

    go, read = threading.Event(), []

    def held(real):
        def held_read(*args):  # the read waits for the test's word: page_in cannot have waited for it
            go.wait(10)
            out = real(*args)
            read.append(True)
            return out
        return held_read

    for reader in ("_read", "_read_own"):  # a page of another store's, and this store's own
        monkeypatch.setattr(storage, reader, held(getattr(storage, reader)))
    model, rt = mlp_rt
    rt.store.inline_below = 0  # the input's page goes to the reader thread, small as it is
    x, y = batches(1)[0]

    def hook(rt):
        before = rt.ledger.live_bytes
        rt.page_in("input")
        assert not read  # returned at once, the bytes still to come
        assert rt.ledger.live_bytes - before == B * D * 4  # counted where the schedule counts it
        rt.page_in = lambda name: None  # the plan's own page_in call below has been made here already
        threading.Timer(0.3, go.set).start()  # the read goes on while the step does

    rt.begin_step(x, y)
    mlp_train_step(rt, hook=hook)
    rt.end_step()
    assert read and rt.paging_wait_s > 0  # the use waited for the read it was handed
    go.set()  # the reads below are not held
    del rt.page_in
    ref = make_mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOM, weight_decay=WD)
    F.nll_loss(F.log_softmax(ref(x), 1), y).backward()
    opt.step()
    for k, v in ref.named_parameters():
        assert torch.equal(rt.params[MLP_NAMES[k]], v.detach()), k

    def corrupt_then_free(rt):
        rt.store.wait("input")
        path = rt.store.path_of("input")
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x01
        path.write_bytes(bytes(raw))
        rt.page_in("input")
        rt.free("input")

    rt.begin_step(x, y)
    with pytest.raises(PageStoreError, match=r"'input'.*checksum mismatch"):
        mlp_train_step(rt, hook=corrupt_then_free)


def _statements(text: str) -> list[str]:
    """plan.py's statements, each with the comment lines right above it (a long reason goes there)."""
    out, notes = [], []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            notes.append(line)
        else:
            out.append(" ".join(notes + [line]))
            notes = []
    return out


def test_compiled_plan_overlaps_paging_and_stays_exact(tmp_path):
    """small_cnn at 40%: compile moves page-ins ahead of their readers and frees of paged-out tensors after
    their writes, within the schedule's peak; the plan
    trains exactly like autograd and the ledger's peak equals the prediction."""
    from edgetrain.compiler.pipeline import CompileOptions, compile_model
    from edgetrain.compiler.workbench.run import run_plan

    out = str(tmp_path / "plan")
    c = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="80%", out=out, time_limit=20.0))
    plan = _statements(open(f"{out}/plan.py").read())
    assert any("rt.page_in(" in s and "read ahead" in s for s in plan) and c["page_ins"] > 0
    assert any("rt.free(" in s and "while its page-out is written" in s for s in plan)
    r = run_plan(out, steps=2, check=True)
    assert r["ok"] and r["max_abs_err"] == 0, r.get("error")
    assert r["measured_peak_bytes"] == r["predicted_peak_bytes"] == c["peak_bytes"] <= c["budget_bytes"]
    flat = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="80%", out=str(tmp_path / "flat"),
                                        time_limit=20.0, overlap_paging=False))
    assert flat["peak_bytes"] == c["peak_bytes"] and flat["page_ins"] == c["page_ins"]
    flat_plan = open(tmp_path / "flat" / "plan.py").read()
    assert "read ahead" not in flat_plan and "page-out is written" not in flat_plan


def test_an_ops_outputs_held_apart_run_it_once_when_computed_one_after_the_other(tmp_path, monkeypatch):
    """The graph holds a max pool's values and its indices as two nodes (read at different times). Computed one
    right after the other on the same operand, the second takes the outputs of the first's call; computed apart
    (here after a free), it runs the op again. The ledger counts both calls as the schedule does."""
    from edgetrain.runtime.python import aten_call

    save_file({"param/w": torch.zeros(1)}, str(tmp_path / "w.safetensors"))
    rt = Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    runs = []
    real = aten_call.run

    def counted(c, *args, **kwargs):
        runs.append(c.op)
        return real(c, *args, **kwargs)

    monkeypatch.setattr(aten_call, "run", counted)
    mp, pool = "aten.max_pool2d_with_indices.default", {"args": [T(0), [2, 2], [2, 2]]}
    x = torch.randn(2, 3, 8, 8)
    values, indices = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
    rt.begin_step(x, torch.zeros(2, dtype=torch.long))
    rt.load_input()
    live0 = rt.ledger.live_bytes
    rt.compute("mp", mp, ["input"], attrs={**pool, "keep": 0})
    rt.compute("mp.out1", mp, ["input"], attrs={**pool, "keep": 1})
    assert runs == [mp]
    assert torch.equal(rt.tensor("mp"), values) and torch.equal(rt.tensor("mp.out1"), indices)
    # each call counts the output it drops while it runs: the second's values beside both held
    assert rt.ledger.peak_bytes == live0 + 2 * values.nbytes + indices.nbytes
    rt.free("mp.out1")
    rt.recompute("mp.out1", mp, ["input"], attrs={**pool, "keep": 1})
    assert runs == [mp, mp] and torch.equal(rt.tensor("mp.out1"), indices)
    rt.compute("mp2", mp, ["mp"], attrs={**pool, "keep": 0})  # another call: its own run
    rt.compute("mp2.out1", mp, ["input"], attrs={**pool, "keep": 1})  # another operand: its own run
    assert runs == [mp] * 4
    for name in ("input", "mp", "mp.out1", "mp2", "mp2.out1"):
        rt.free(name)
    rt.end_step()


def test_page_store_writes_a_views_own_bytes(tmp_path):
    """A page is read from the tensor's address: a slice's bytes start at its offset, a transposed view's are
    stored in memory order, a non-dense one's copied; each comes back equal (on the threads and inline)."""
    base = torch.randn(6, 40)
    views = {"slice": base[2:5], "tail": base.reshape(-1)[17:], "transposed": base.t(), "strided": base[:, ::3]}
    for inline_below in (0, None):
        store = FileStore(tmp_path / str(inline_below), inline_below=inline_below)
        for name, v in views.items():
            store.page_out(name, v)
        for name, v in views.items():
            assert torch.equal(store.page_in(name), v), name


def test_a_device_tensor_is_written_once_its_copy_has_arrived(tmp_path, monkeypatch):
    """Paging out from a GPU queues the copy to the host and goes on; the writer waits for the copy before it reads
    the bytes, on its thread or inline (a stand-in device here: its copy arrives only when waited for)."""
    from edgetrain.runtime.python import storage

    want = torch.randn(50_000)
    waits = []

    def to_host(t):
        host = torch.zeros(t.shape)  # queued, not arrived

        def copied():
            waits.append(t.device.type)
            host.copy_(want)
        return host, copied

    monkeypatch.setattr(storage, "_to_host", to_host)
    for inline_below in (0, 1 << 30):  # the writer thread, then the calling thread
        store = FileStore(tmp_path / str(inline_below), inline_below=inline_below)
        store.page_out("t", torch.empty(50_000, device="meta"))
        store.wait("t")
        assert torch.equal(store.page_in("t"), want)
    assert waits == ["meta", "meta"]


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
    rt.compute("fc1", ADDMM, ["input"], params=["fc1.weight", "fc1.bias"], attrs=linear("fc1"))
    rt.free("input")
    relu = {"args": [T(0)]}
    with pytest.raises(PlanError, match=r"step 0, op #4 compute 'relu0'.*'input' is not resident \(freed at op #3\)"):
        rt.compute("relu0", RELU, ["input"], attrs=relu)
    with pytest.raises(PlanError, match="'nope' is not resident.*never computed"):
        rt.compute("relu1", RELU, ["nope"], attrs=relu)
    with pytest.raises(PlanError, match="'fc1' is already resident"):
        rt.compute("fc1", ADDMM, ["fc1"], params=["fc1.weight", "fc1.bias"], attrs=linear("fc1"))
    with pytest.raises(PlanError, match="'input' was not paged out"):
        rt.page_in("input")
    with pytest.raises(PlanError, match="'silu' is not an aten op"):
        rt.compute("g", "silu", ["fc1"])
    with pytest.raises(PlanError, match="no aten op named 'aten.nosuchop.default'"):
        rt.compute("g", "aten.nosuchop.default", ["fc1"], attrs=relu)
    cpu, rt.device = rt.device, torch.device("cuda")  # a CPU target's plan run on a GPU: refused at its first such op
    with pytest.raises(PlanError, match=r"'aten._scaled_dot_product_flash_attention_for_cpu.default' is a CPU-only "
                                        r"kernel.*compile it for a GPU target"):
        rt.compute("g", "aten._scaled_dot_product_flash_attention_for_cpu.default", ["fc1"], attrs=relu)
    rt.device = cpu
    with pytest.raises(PlanError, match="unknown .*'fc9.bias'"):
        rt.compute("h", ADDMM, ["fc1"], attrs={"args": [P("fc9.bias"), T(0), P("fc9.weight", TR)]})
    with pytest.raises(PlanError, match="'fc1.aux' is not resident"):
        rt.compute("h", RELU, ["fc1"], attrs=relu, aux_of="fc1")
    with pytest.raises(PlanError, match=r"compute 'g'.*view \[\['aten.view.default', \[\[999\]\]\]\] of 'fc1'"):
        rt.compute("g", RELU, [{"t": "fc1", "view": [["aten.view.default", [[999]]]]}], attrs=relu)
    # A view held as a tensor of its own would be counted twice: an op whose schema lets it alias is checked
    with pytest.raises(PlanError, match="compute 'v'.*the op's output aliases an operand"):
        rt.compute("v", "aten.view.default", ["fc1"], attrs={"args": [T(0), [-1]]})
    with pytest.warns(RuntimeWarning, match="left 1 tensors resident: fc1"):
        rt.end_step()
    assert rt.leftovers == ["fc1"] and rt.step == 1


def test_views_cost_nothing(mlp_rt):
    _, rt = mlp_rt
    x, y = batches(1)[0]
    rt.begin_step(x, y)
    rt.load_input()
    live = rt.ledger.live_bytes
    rt.compute("r", RELU, [{"t": "input", "view": [["aten.view.default", [[2, 2, D]]],
                                                   ["aten.select.int", [1, 1]]]}], attrs={"args": [T(0)]})
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


def test_load_plan(tmp_path):
    model = make_mlp()
    save_weights(model, tmp_path / "weights.safetensors", MLP_NAMES)
    (tmp_path / "plan.py").write_text(
        "PLAN = {'weights': 'weights.safetensors', 'optimizer': {'lr': 0.1, 'momentum': 0.9, "
        "'weight_decay': 0.0005}, 'seed': 0}\n"
        "def train_step(rt):\n"
        "    rt.load_input()\n"
        "    rt.compute('fc1', 'aten.addmm.default', ['input'], attrs={'args': [{'$p': 'fc1.bias'}, {'$t': 0}, "
        "{'$p': 'fc1.weight', 'view': [['aten.t.default', []]]}]})\n"
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


def test_dropped_outputs_count_except_an_ops_scratch():
    """The runtime's transient and the compiler's workspace are one rule: every output the node drops counts,
    except outputs at most 1/64 of the op's largest (a batch-norm's new running statistics)."""
    from edgetrain.runtime.python.aten_call import SCRATCH_SHARE, dropped_bytes

    big, grad, tiny = torch.zeros(64, 64), torch.zeros(32, 64), torch.zeros(64)
    assert dropped_bytes([big, grad, tiny], None) == grad.numel() * 4  # keep output 0; tiny is scratch
    assert dropped_bytes([big, grad, tiny], "none") == (big.numel() + grad.numel()) * 4
    assert dropped_bytes([big, grad, tiny], [0, 1]) == 0
    assert dropped_bytes([big, grad, tiny], 0, aux=[1]) == 0
    assert dropped_bytes([tiny], "none") == tiny.numel() * 4  # an op's only output is never its scratch
    assert tiny.numel() * 4 * SCRATCH_SHARE <= big.numel() * 4


def test_run_trains_and_checks_a_cpu_plan_at_its_targets_thread_count(tmp_path, monkeypatch):
    """A plan's kernel scratch is counted for its target's threads (a Raspberry Pi 4's four cores), so the runtime
    trains each step at that count and gives the caller's back after it; `run --check` trains the autograd
    reference at the same count (oneDNN's sums in the same order: bitwise equal)."""
    from edgetrain.compiler.pipeline import CompileOptions, compile_model
    from edgetrain.compiler.workbench import run as run_mod
    from edgetrain.runtime.python import load_plan
    from edgetrain.targets import load_target

    threads = load_target("rpi4").cpu_threads
    assert threads == 4
    out = str(tmp_path / "plan")
    r = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", out=out, time_limit=20.0))
    assert load_plan(out).PLAN["threads"] == r["threads"] == threads
    seen = {"plan": [], "between": []}
    load_input, reference = Runtime.load_input, run_mod.train_reference
    monkeypatch.setattr(Runtime, "load_input", lambda self: seen["plan"].append(torch.get_num_threads())
                        or load_input(self))
    monkeypatch.setattr(Runtime, "begin_step", lambda self, x, y, f=Runtime.begin_step:
                        seen["between"].append(torch.get_num_threads()) or f(self, x, y))
    monkeypatch.setattr(run_mod, "train_reference", lambda *a: seen.setdefault("reference", torch.get_num_threads())
                        and reference(*a))
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the caller's count differs from the plan's
    try:
        r = run_mod.run_plan(out, steps=2, check=True, device="cpu")
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)
    assert seen == {"plan": [threads, threads], "between": [1, 1], "reference": threads}
    assert after == 1 and r["max_abs_err"] == 0


def test_a_step_cut_short_gives_the_callers_thread_count_back(tmp_path):
    """A plan that fails inside its step does not leave torch pinned at the plan's thread count."""
    import types

    from edgetrain.runtime.python.checks import checked_step

    rt = Runtime(save_weights(make_mlp(), tmp_path / "w.safetensors", MLP_NAMES), tmp_path / "pages", device="cpu",
                 lr=LR, threads=3)
    seen = []
    plan = types.SimpleNamespace(PLAN={}, train_step=lambda rt: seen.append(torch.get_num_threads()) or rt.free("x"))
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(PlanError, match="'x' is not resident"):
            checked_step(plan, rt, torch.zeros(1), torch.zeros(1))
        assert seen == [3] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
