"""The compiled direct convolution (kernels/cpu/conv.c) against float64 references and the
NumPy path: kernels alone, the Conv2d layer, whole models' gradients, the fall-back and
the build cache, which loads no library it cannot trust (one planted by another user)."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from syncbench.kernels import cpu_native, ops
from syncbench.kernels.layers import Conv2d
from syncbench.kernels.zoo import build_model

#: The tests of the kernels themselves: only where the library builds on this core. The
#: cache's checks are tested with a stand-in library wherever a C compiler works.
native = pytest.mark.skipif(cpu_native.library() is None,
                            reason=f"no compiled kernels: {cpu_native.status()}")

#: (n, c, h, K, k, pad, stride): every remainder of the register blocks (K mod 4, n / 16
#: mod 4, C*k*k mod 6), a ResNet's shapes, LeNet's, a 1 x 1 and a stride-2 convolution.
GEOMETRIES = [
    (64, 16, 12, 16, 3, 1, 1),
    (16, 3, 9, 5, 3, 1, 1),
    (32, 6, 10, 6, 5, 0, 1),
    (48, 1, 11, 7, 5, 2, 1),
    (80, 4, 7, 3, 1, 0, 1),
    (64, 16, 10, 32, 3, 1, 2),
    (16, 2, 9, 9, 3, 0, 2),
]


def float64_reference(x, w, pad, stride):
    """The convolution and its column matrix, by ops' im2col in float64."""
    n, _, h, width = x.shape
    cols = ops.im2col(x.astype(np.float64), w.shape[2], pad, stride)
    oh, ow = ops.conv_output_hw(h, width, w.shape[2], pad, stride)
    y = (w.reshape(w.shape[0], -1).astype(np.float64) @ cols).reshape(w.shape[0], n, oh, ow)
    return y, cols


@native
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_kernels_equal_the_float64_im2col_convolution(geometry):
    n, c, h, k_out, k, pad, stride = geometry
    rng = np.random.default_rng(sum(geometry))
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((k_out, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(k_out).astype(np.float32)
    planes = np.zeros((c, h + 2 * pad, h + 2 * pad, n), np.float32)
    planes[:, pad : pad + h, pad : pad + h] = x.transpose(1, 2, 3, 0)
    y, cols = float64_reference(x, w, pad, stride)
    oh = y.shape[2]
    out = np.full((k_out, oh, oh, n), np.nan, np.float32)
    packed = cpu_native.pack_weights(w, np.empty(cpu_native.packed_shape(w.shape), np.float32))
    taps = cpu_native.window_taps(c, *planes.shape[1:], k)
    cpu_native.conv_forward(planes, packed, bias, out, taps, stride)
    expect = y.transpose(0, 2, 3, 1) + bias[:, None, None, None]
    np.testing.assert_allclose(out, expect, rtol=0, atol=2e-6 * np.abs(expect).max())

    dy = rng.standard_normal(out.shape).astype(np.float32)
    dweight = np.full(w.shape, np.nan, np.float32)
    work = np.empty(cpu_native.weight_grad_work(c, k), np.float32)
    cpu_native.conv_weight_grad(planes, dy, dweight, work, taps, stride)
    expect_dw = (dy.transpose(0, 3, 1, 2).reshape(k_out, -1).astype(np.float64)
                 @ cols.T).reshape(w.shape)
    np.testing.assert_allclose(dweight, expect_dw, rtol=0,
                               atol=2e-6 * np.abs(expect_dw).max())


@native
def test_packed_weights_put_four_output_channels_of_one_tap_together():
    w = np.arange(6 * 2 * 3 * 3, dtype=np.float32).reshape(6, 2, 3, 3)
    packed = cpu_native.pack_weights(w, np.full(cpu_native.packed_shape(w.shape), -1.0,
                                                np.float32))
    assert packed.shape == (2, 18, 4)
    assert list(packed[0, 9 + 6]) == [w[a, 1, 2, 0] for a in range(4)]
    assert list(packed[1, 1]) == [w[4, 0, 0, 1], w[5, 0, 0, 1], 0.0, 0.0]


@native
def test_input_gradient_phases_of_a_stride_2_convolution():
    # 3 x 3, padding 1, stride 2, 14 -> 7: even input pixels take tap 1 of the same
    # output pixel, odd ones taps 0 and 2 of the next and the same (one zero row after).
    before, after, phases = cpu_native.input_grad_phases(14, 7, 3, 1, 2)
    assert (before, after) == (0, 1)
    assert phases == [(0, [1], [0]), (1, [0, 2], [1, 0])]
    # stride 1 is one phase: the flipped kernel over the gradient padded by k - 1 - pad
    assert cpu_native.input_grad_phases(10, 10, 3, 1, 1) == (1, 1, [(0, [0, 1, 2], [2, 1, 0])])


def layer_pass(make, x, dy, params, direct, monkeypatch):
    """Forward and backward of a fresh layer with ``params``, by the direct kernels or not."""
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(cpu_native, "numpy_only", True)
        layer = make()
        grads = [np.zeros_like(p) for p in params]
        layer.bind([p.copy() for p in params], grads)
        y = np.array(layer.forward(x))
        assert layer._direct is direct
        dx = layer.backward(dy)
    return y, (None if dx is None else np.array(dx)), grads


@native
@pytest.mark.parametrize("make, in_shape", [
    (lambda: Conv2d(16, 16, 3, padding=1, bias=False), (64, 16, 8, 8)),
    (lambda: Conv2d(16, 32, 3, padding=1, stride=2, bias=False), (32, 16, 8, 8)),
    (lambda: Conv2d(6, 16, 5), (16, 6, 12, 12)),
    (lambda: Conv2d(1, 6, 5, padding=2), (48, 1, 10, 10)),
    (lambda: Conv2d(8, 4, 3, padding=1, stride=2, bias=False), (16, 8, 7, 9)),
    (lambda: Conv2d(5, 6, 1, stride=2), (16, 5, 6, 6)),
    (lambda: Conv2d(3, 5, 4, padding=2, stride=3), (32, 3, 11, 10)),
])
@native
def test_conv2d_layer_equals_its_numpy_path(make, in_shape, monkeypatch):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(in_shape).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) for s in make().param_shapes()]
    out_shape = (in_shape[0], *make().output_shape(in_shape[1:]))
    dy = rng.standard_normal(out_shape).astype(np.float32)
    fast = layer_pass(make, x, dy, params, True, monkeypatch)
    slow = layer_pass(make, x, dy, params, False, monkeypatch)
    for a, b in zip([fast[0], fast[1], *fast[2]], [slow[0], slow[1], *slow[2]], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


@native
@pytest.mark.parametrize("name, shape", [("resnet8", (3, 32, 32)), ("lenet", (1, 28, 28))])
def test_a_models_float32_gradient_is_near_the_float64_one(name, shape, monkeypatch):
    """The compiled float32 step against the float64 gradient (the NumPy path; the compiled
    kernels take only float32), beside the NumPy float32 step: both within 1e-5 of it in
    norm (they are near 5e-7; a 1 % error in one BatchNorm constant gives 7e-3). The data
    seed matters: at seeds 0 and 3 one pre-activation of resnet8 lies within float32
    rounding of 0 (3e-7 about a scale of 5), one path takes the ReLU's other side, and the
    gradient below it moves by 5e-4 (seed 3, compiled) or 1.4e-3 (seed 0, NumPy)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, *shape))
    labels = rng.integers(0, 10, size=32)

    def gradient(dtype, direct):
        with monkeypatch.context() as patch:
            if not direct:
                patch.setattr(cpu_native, "numpy_only", True)
            model = build_model(name, shape, 10, dtype=dtype, seed=1)
            loss = model.loss_and_grad(x.astype(dtype), labels)
            return loss, model.grads.astype(np.float64)

    loss64, exact = gradient(np.float64, False)
    for direct in (True, False):
        loss, grad = gradient(np.float32, direct)
        assert np.linalg.norm(grad - exact) <= 1e-5 * np.linalg.norm(exact), direct
        assert abs(loss - loss64) <= 1e-5 * abs(loss64)


@native
def test_a_batch_the_kernels_do_not_take_runs_the_numpy_path():
    assert not cpu_native.usable(10, np.dtype(np.float32))
    assert not cpu_native.usable(64, np.dtype(np.float64))
    layer = Conv2d(2, 3, 3, padding=1)
    layer.bind([np.ones((3, 2, 3, 3), np.float32), np.zeros(3, np.float32)],
               [np.zeros((3, 2, 3, 3), np.float32), np.zeros(3, np.float32)])
    y = layer.forward(np.ones((10, 2, 4, 4), np.float32))
    assert not layer._direct and float(y[0, 0, 1, 1]) == 18.0


@native
def test_the_library_is_built_once_into_the_cache_and_can_be_turned_off(tmp_path):
    env = {**os.environ, "SYNCBENCH_CACHE": str(tmp_path)}
    probe = ("from syncbench.kernels import cpu_native as c; print(c.status()); "
             "import glob; print(len(glob.glob(str(c.cache_dir() / '*.so'))))")
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    assert first[0].startswith("native") and first[1] == "1"
    (built,) = (tmp_path / "cpu-kernels").glob("*.so")
    stamp = built.stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True)
    assert built.stat().st_mtime_ns == stamp
    off = subprocess.run([sys.executable, "-c", probe],
                         env={**env, cpu_native.MODE_VARIABLE: "numpy"},
                         capture_output=True, text=True, check=True).stdout
    assert off.startswith(f"numpy ({cpu_native.MODE_VARIABLE}=numpy)")


@native
def test_batchnorm_element_wise_passes_equal_the_numpy_paths_bit_for_bit(monkeypatch):
    """The affine with its ReLU mask and the input gradient round as the NumPy path (no
    fused multiply-add), so they are equal to the bit; the sums, in double, are closer to
    the float64 sums than the NumPy path's float32 ones."""
    from syncbench.kernels import cpu_norm

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 3000)) * 0.5 + 2.0).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    scale, offset, shift = (rng.standard_normal(8).astype(np.float32) for _ in range(3))

    def passes(numpy_only):
        with monkeypatch.context() as patch:
            patch.setattr(cpu_native, "numpy_only", numpy_only)
            work, y, dx = (np.full_like(x, np.nan) for _ in range(3))
            mask, tmp = np.zeros(x.shape, bool), np.empty_like(x)
            sums = cpu_norm.sums_about(x, shift, work)
            cpu_norm.affine(x, scale, offset, y, mask)
            grads = cpu_norm.grad_sums(dy, work, centred, invstd, mask, tmp)
            cpu_norm.input_grad(dy, work, centred, invstd, scale, mean_dy, mean_dy_xhat, dx,
                                tmp, mask)
            return work, y, mask, dx, sums, grads

    centred, invstd, mean_dy, mean_dy_xhat = (
        rng.standard_normal(8).astype(np.float32) for _ in range(4))

    fast, slow = passes(False), passes(True)
    for a, b in zip(fast[:4], slow[:4], strict=True):
        assert np.array_equal(a, b)
    assert mask_has_both(fast[2])
    work, g = fast[0].astype(np.float64), dy.astype(np.float64) * fast[2]
    exact = [work.sum(axis=1), (work * work).sum(axis=1), g.sum(axis=1),
             invstd * ((g * work).sum(axis=1) - centred * g.sum(axis=1))]
    for got, slow_sum, want in zip([*fast[4], *fast[5]], [*slow[4], *slow[5]], exact,
                                   strict=True):
        assert np.abs(got - want).max() <= np.abs(slow_sum - want).max() + 1e-6 * np.abs(
            want).max()


def mask_has_both(mask):
    return bool(mask.any()) and not bool(mask.all())


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decay", ["none", "scalar", "array"])
def test_momentum_update_equals_the_reference_to_the_bit(dtype, decay):
    rng = np.random.default_rng(11)
    w, g, v = (rng.standard_normal(10_001).astype(dtype) for _ in range(3))
    wd = {"none": 0.0, "scalar": 5e-4, "array": (rng.random(w.size) < 0.5).astype(dtype) * 5e-4}
    wd = wd[decay]
    expect_w, expect_v = w.copy(), v.copy()
    ops.REFERENCES["sgd_momentum_"](expect_w, g, expect_v, 0.1, 0.9, wd, np.empty_like(w))
    assert cpu_native.sgd_momentum_(w, g, v, 0.1, 0.9, wd)
    assert np.array_equal(w, expect_w) and np.array_equal(v, expect_v)
    # a float64 scalar with float32 buffers computes in float64 in NumPy: the reference's
    assert cpu_native.sgd_momentum_(w, g, v, np.float64(0.1), 0.9, wd) == (dtype == np.float64)


# -- the cache loads no library another user could have planted --------------------------
needs_cc = pytest.mark.skipif(cpu_native.compiler() is None, reason="no C compiler")
#: Builds and loads the library of the sources in argv[1] (a stand-in for kernels/cpu, so
#: that these tests run on any core), with the cache of $SYNCBENCH_CACHE.
PROBE = ("import sys; from pathlib import Path; from syncbench.kernels import cpu_native as c; "
         "c.SOURCES = Path(sys.argv[1]); print(c.status())")
LINE = "syncbench: compiled CPU kernels: "


@pytest.fixture
def stand_in(tmp_path):
    """(sources, the cached library's name, a planted library, its marker file): the
    stand-in sources define every kernel the loader declares, as no-ops; so does the
    planted library, whose constructor writes the marker as soon as anything loads it."""
    sources = tmp_path / "src"
    sources.mkdir()
    names = re.findall(r'"(sb_\w+)"', inspect.getsource(cpu_native._declare))
    stubs = "".join(f"void {n}(void) {{}}\n" for n in names)
    (sources / "stub.c").write_text(stubs)
    marker = tmp_path / "MARKER"
    (tmp_path / "planted.c").write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
        + stubs)
    planted = tmp_path / "planted.so"
    subprocess.run([cpu_native.compiler(), "-shared", "-fPIC", "-o", str(planted),
                    str(tmp_path / "planted.c")], check=True)
    # the name the cache gives this library: build it once into a scratch cache
    _probe(sources, tmp_path / "scratch")
    (built,) = (tmp_path / "scratch" / "cpu-kernels").glob("cpu-*.so")
    return sources, built.name, planted, marker


def _probe(sources: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, str(sources)], capture_output=True,
                          text=True, check=True, timeout=120,
                          env={**os.environ, "SYNCBENCH_CACHE": str(cache)})


def _planted_cache(tmp_path, name, planted, folder_mode=0o700, owner=None, file_owner=None,
                   file_mode=0o755, digest="planted", link=False):
    """A cache folder holding ``planted`` under the library's name; ``digest``: the
    recorded SHA-256 ("planted": the planted file's own, "other": another's, None: none)."""
    folder = tmp_path / "cache" / "cpu-kernels"
    folder.mkdir(parents=True)
    target = folder / name
    if link:
        target.symlink_to(planted)
    else:
        shutil.copy(planted, target)
        os.chmod(target, file_mode)
    if digest is not None:
        data = planted.read_bytes() if digest == "planted" else b"another library"
        (folder / f"{name}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    if file_owner is not None:
        os.chown(target, file_owner, file_owner)
        if digest is not None:
            os.chown(folder / f"{name}.sha256", file_owner, file_owner)
    if owner is not None:
        os.chown(folder, owner, owner)
    os.chmod(folder, folder_mode)
    return folder


def _said(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith(LINE)]


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
#: Cache folders nobody else may have written to: a planted library in them fails its own
#: checks and is rebuilt over.
PLANTED_FILES = {
    "no recorded hash": ({"digest": None}, "has no recorded SHA-256"),
    "another library's hash": ({"digest": "other"}, "does not match its recorded SHA-256"),
    "group-writable file": ({"file_mode": 0o775}, "is writable by its group or others"),
    "symbolic link": ({"link": True}, "cannot be opened"),
    "another user's file": ({"file_owner": 65534}, "belongs to uid 65534"),
}
#: Cache folders another user could have written to: not used at all.
UNSAFE_FOLDERS = {
    "world-writable folder": ({"folder_mode": 0o777}, "is writable by its group or others"),
    "group-writable folder": ({"folder_mode": 0o770}, "is writable by its group or others"),
    "another user's folder": ({"owner": 65534, "folder_mode": 0o755}, "belongs to uid 65534"),
}


def _marks(cases):
    return [pytest.param(*case, id=name, marks=[root_only] if "user's" in name else [])
            for name, case in cases.items()]


@needs_cc
@pytest.mark.parametrize("setup, said", _marks(PLANTED_FILES))
def test_a_planted_library_in_the_cache_is_not_loaded_but_rebuilt(tmp_path, stand_in, setup,
                                                                   said):
    sources, name, planted, marker = stand_in
    folder = _planted_cache(tmp_path, name, planted, **setup)
    proc = _probe(sources, tmp_path / "cache")
    assert not marker.exists(), "the planted library was loaded"
    assert proc.stdout.startswith("native (compiled with"), proc.stdout
    [line] = _said(proc)
    assert said in line and str(folder / name) in line and line.endswith("not loaded, rebuilt")
    rebuilt = folder / name
    assert not rebuilt.is_symlink() and rebuilt.stat().st_uid == os.geteuid()
    assert (folder / f"{name}.sha256").read_text().strip() == \
        hashlib.sha256(rebuilt.read_bytes()).hexdigest()
    again = _probe(sources, tmp_path / "cache")  # the rebuilt library is trusted
    assert not _said(again) and not marker.exists()


@needs_cc
@pytest.mark.parametrize("setup, said", _marks(UNSAFE_FOLDERS))
def test_a_cache_folder_others_could_write_to_is_not_used(tmp_path, stand_in, setup, said):
    sources, name, planted, marker = stand_in
    folder = _planted_cache(tmp_path, name, planted, **setup)
    proc = _probe(sources, tmp_path / "cache")
    assert not marker.exists(), "the planted library was loaded"
    [line] = _said(proc)
    assert said in line and str(folder) in line
    assert line.endswith("cache not used, the kernels are built for this process only")
    assert proc.stdout.startswith("native (compiled with") and "not cached" in proc.stdout
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, f"{name}.sha256"])
    assert (folder / name).read_bytes() == planted.read_bytes()  # left as it was


@needs_cc
def test_the_cache_folder_is_private_and_a_built_library_is_loaded_from_it(tmp_path,
                                                                          stand_in):
    sources, name, _, _ = stand_in
    proc = _probe(sources, tmp_path / "cache")
    folder = tmp_path / "cache" / "cpu-kernels"
    assert proc.stdout.startswith("native (compiled with") and not _said(proc)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, f"{name}.sha256"])
    built = folder / name
    stamp = built.stat().st_mtime_ns
    again = _probe(sources, tmp_path / "cache")
    assert again.stdout == proc.stdout and not _said(again)
    assert built.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    # an older cache folder that others may read (made with the umask) becomes 0700
    os.chmod(folder, 0o755)
    _probe(sources, tmp_path / "cache")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_cupys_kernel_cache_is_used_only_where_nobody_else_can_write(tmp_path, monkeypatch):
    """CuPy loads cached GPU kernels by a hash of public inputs: a folder another user
    owns or may write to is named (CuPy then keeps kernels in memory, backend)."""
    from syncbench.kernels import backend

    folder = tmp_path / "kernel_cache"
    monkeypatch.setenv("CUPY_CACHE_DIR", str(folder))
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    os.chmod(tmp_path, 0o700)
    assert backend.cupy_cache_untrusted() == ""  # not made yet, in a private folder
    folder.mkdir(mode=0o700)
    assert backend.cupy_cache_untrusted() == ""
    os.chmod(folder, 0o777)
    assert "is writable by its group or others (mode 0777)" in backend.cupy_cache_untrusted()
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    assert backend.cupy_cache_untrusted() == ""
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY")
    if os.geteuid() == 0:
        os.chmod(folder, 0o700)
        os.chown(folder, 65534, 65534)
        assert "belongs to uid 65534" in backend.cupy_cache_untrusted()
