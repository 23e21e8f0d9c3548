"""Build and load the fused CPU depth-attention kernel (``depth_attend.c``), or say why not.

The kernel is plain C with OpenMP and no PyTorch headers, so the system compiler builds it in
about a second (a PyTorch C++ extension takes a minute and needs ninja). It is built once per
machine and source version into ``$ATTNRES_CACHE`` (default ``~/.cache/attnres``); a built
library is renamed into place whole, so ranks that start together do not see half a file. It
links the ``libgomp`` that PyTorch has already loaded, so it shares PyTorch's thread pool.

Where there is no C compiler, or the build fails, :func:`kernel` returns None and depth attention
runs on its PyTorch path, which computes the same thing more slowly. ``ATTNRES_CPU_KERNEL=0``
chooses the PyTorch path on purpose (the equivalence tests run both).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from attnres import paths

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("depth_attend.c")
FLAGS = ["-O3", "-march=native", "-std=c11", "-fopenmp", "-fPIC", "-shared"]
SUFFIX = {torch.float32: ("float", "f32"), torch.float64: ("double", "f64")}

_P = ctypes.c_void_p
_I = ctypes.c_int64
_i = ctypes.c_int
_FWD = [_I, _I, _i, _i, _i, _i, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]
_BWD = [_I, _I, _i, _i, _i, _i, _i, _P, _P, _P, _P, _P, _P, _P, _P, _i, _P, _P, _P, _P, _P, _P, _P, _P, _P]


def cache_dir() -> Path:
    return paths.kernel_cache()


def enabled() -> bool:
    """False when ``ATTNRES_CPU_KERNEL`` is 0/false/no: the PyTorch path is then used everywhere."""
    return os.environ.get("ATTNRES_CPU_KERNEL", "1").strip().lower() not in {"0", "false", "no", "off"}


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> bytes:
    """The CPU's feature flags: ``-march=native`` code is only reused on a CPU that has them all
    (a home directory can be shared by cluster nodes of different generations)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    return next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "").encode()


def _build(cc: str, ctype: str, suffix: str) -> Path:
    """Compile the kernel for one scalar type, or reuse the library built from the same inputs."""
    text = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([text, cc.encode(), " ".join(FLAGS).encode(), ctype.encode(),
                                     platform.machine().encode(), _cpu_flags()])).hexdigest()[:16]
    out = cache_dir() / f"depth_attend_{suffix}_{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, f"-DT={ctype}", f"-DSUF={suffix}", str(SOURCE), "-o", tmp, "-lm"],
                       check=True, capture_output=True, text=True, timeout=120)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


@functools.cache
def _load(dtype: torch.dtype) -> tuple[object, object] | None:
    cc = _compiler()
    if cc is None:
        _warn_once("no C compiler found: depth attention runs on its slower PyTorch path")
        return None
    ctype, suffix = SUFFIX[dtype]
    try:
        lib = ctypes.CDLL(str(_build(cc, ctype, suffix)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        why = detail.strip().splitlines()[-1] if detail.strip() else type(e).__name__
        _warn_once(f"depth-attention CPU kernel not built ({why}): using the PyTorch path")
        return None
    fwd, bwd = getattr(lib, f"attend_fwd_{suffix}"), getattr(lib, f"attend_bwd_{suffix}")
    fwd.argtypes, bwd.argtypes = _FWD, _BWD
    fwd.restype = bwd.restype = ctypes.c_int
    fwd.errcheck = bwd.errcheck = _check
    return fwd, bwd


def _check(result: int, func: object, args: tuple) -> int:
    """The kernels return non-zero only when their scratch memory could not be allocated."""
    if result:
        raise MemoryError("depth-attention CPU kernel: out of memory for its scratch buffers")
    return result


def kernel(tensors: list[Tensor]) -> tuple[object, object] | None:
    """(forward, backward) C functions when every tensor is a CPU float32 (or float64) tensor of one
    dtype and the kernel is enabled and built; otherwise None."""
    dt = tensors[0].dtype
    if not enabled() or dt not in SUFFIX or any(t.device.type != "cpu" or t.dtype != dt for t in tensors):
        return None
    return _load(dt)


def widens(tensors: list[Tensor], cdt: torch.dtype) -> bool:
    """Whether a call mixes bf16 CPU tensors into float32 ones, which the kernel then takes as float32 copies.

    The kernel takes one dtype. A bf16 value is exact in float32, so the copies give bit for bit the
    result of float32 sources (their gradients come back float32, and autograd rounds them to bf16 once);
    without them such a call would take the PyTorch path, which differs from the kernel in last bits,
    enough to round some bf16 gradient the other way.
    """
    dtypes = {t.dtype for t in tensors}
    return enabled() and cdt == torch.float32 and torch.bfloat16 in dtypes and dtypes <= {torch.bfloat16, cdt} \
        and all(t.device.type == "cpu" for t in tensors)


def status() -> str:
    """Which path CPU depth attention takes here, in words (for ``attnres bench``)."""
    if not enabled():
        return "pytorch (ATTNRES_CPU_KERNEL=0)"
    return "c" if _load(torch.float32) is not None else "pytorch (no C kernel: see the warning above)"


def ptr(t: Tensor | None) -> int | None:
    """A contiguous tensor's data address (None for a missing optional argument)."""
    return None if t is None else t.data_ptr()


def ptrs(ts: list[Tensor | None]) -> ctypes.Array:
    """A C array of data addresses (NULL for None)."""
    return (ctypes.c_void_p * len(ts))(*[ptr(t) for t in ts])
