"""A simulated accelerator for CPU tests: a second device, ``simgpu``, whose tensors compute on the CPU.

The test suite runs on a CPU, where every tensor is on the one device there is, so code that builds a tensor on the
CPU while the model sits on a GPU (``torch.tensor(ids)`` instead of ``torch.tensor(ids, device=model.device)``)
passes here and fails on the first GPU ("Expected all tensors to be on the same device"). Under :func:`simulated_gpu`
the model and everything placed where the model is live on ``simgpu``: a tensor of that device is a wrapper around a
CPU tensor (PyTorch's Python backend for its ``PrivateUse1`` device, a tensor subclass whose ``__torch_dispatch__``
runs each operation on the wrapped CPU tensors), so training computes the same numbers, while an operation that mixes
a ``simgpu`` tensor with a CPU tensor raises the error CUDA raises (a 0-dim CPU tensor, a Python scalar to CUDA, is
allowed as CUDA allows it). ``.cpu()``, ``.item()`` and ``.tolist()`` work, as on CUDA; ``.numpy()`` of a ``simgpu``
tensor fails, as on CUDA.

Inside :func:`simulated_gpu`, ``TrainingArguments.device``, accelerate's ``Accelerator.device`` and
sentence-transformers' default device are ``simgpu``: the trainers move their models there, sentence-transformers
loads encoders there, and every step's inputs have to follow.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.utils._pytree import tree_map

NAME = "simgpu"
_MOVES = (torch.ops.aten._to_copy.default,)
_COPIES = (
    torch.ops.aten.copy_.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
)
# indexing takes its indices from either device (CUDA accepts CPU indices): only the indexed tensor and the values
_INDEXING = (
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default,
)
_autocast = threading.local()  # .dtype: the simulated device's autocast dtype during the Python call being run
_registered: list = []  # the backend registration and its kernels (once per process; PyTorch allows one rename)
ops_seen: list[int] = [0]
active: list[
    bool
] = []  # non-empty inside simulated_gpu: only there is simgpu an available accelerator  # operations run on simgpu tensors (a test can check the simulation was used)


class SimTensor(torch.Tensor):
    """A tensor of the simulated device: it holds a CPU tensor (``inner``) and reports device ``simgpu``."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=torch.device(NAME, 0),
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def __repr__(self):
        return f"SimTensor({self.inner!r}, device='{NAME}')"

    def __reduce_ex__(self, protocol):  # torch.save (an optimizer's state in a checkpoint): saved as a CPU tensor
        return self.inner.detach().__reduce_ex__(protocol)

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return SimTensor(inner_tensors["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _is_sim_device(device) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == NAME


def _run(func, args, kwargs):
    """``func`` on the CPU tensors the ``simgpu`` tensors hold; its tensor results on ``simgpu`` (on the CPU after a
    move to the CPU). Refuses, as CUDA does, an operation mixing a ``simgpu`` tensor with a CPU tensor."""
    ops_seen[0] += 1
    devices: set[str] = set()

    def unwrap(x):
        if isinstance(x, SimTensor):
            devices.add(NAME)
            return x.inner
        if isinstance(x, torch.Tensor) and not (x.dim() == 0 and x.device.type == "cpu"):
            devices.add(x.device.type)
        return x

    wrappers = {id(x.inner): x for x in _leaves((args, kwargs)) if isinstance(x, SimTensor)}
    if func in _INDEXING:
        checked = [args[0], *args[2:3]]
        tree_map(unwrap, checked)
        args = (unwrap(args[0]), [None if i is None else _inner(i) for i in args[1]], *tree_map(unwrap, args[2:]))
        kwargs = tree_map(unwrap, kwargs)
    else:
        args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    to_sim = NAME in devices
    if func in _MOVES or "device" in kwargs:
        target = kwargs.get("device")
        if target is not None:  # a move (or a factory) names its device: that decides where the result is
            to_sim = _is_sim_device(target)
            kwargs = {**kwargs, "device": torch.device("cpu")}
    elif len(devices) > 1 and func not in _COPIES:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {NAME}:0 and cpu! "
            f"(when running {func}; a tensor was built on the CPU while the model is on {NAME})"
        )
    kwargs.pop("pin_memory", None)
    autocast = getattr(_autocast, "dtype", None)
    if to_sim and autocast is not None:
        # autocast on the device: its autocast key falls through to here, and the CPU kernels run under CPU autocast
        # in the same dtype, so a matmul computes in bf16 as the device's autocast would have it
        with torch.autocast("cpu", dtype=autocast):
            out = func(*args, **kwargs)
    else:
        out = func(*args, **kwargs)
    if not to_sim:
        return out

    def wrap(x):  # an in-place operation returns its own argument, as the operation on the device would
        if not isinstance(x, torch.Tensor) or isinstance(x, SimTensor):
            return x
        own = wrappers.get(id(x))
        if own is not None:
            return own
        with torch.inference_mode(False):  # (a view of a model buffer under inference mode takes its version counter)
            return SimTensor(x)

    return tree_map(wrap, out)


def _inner(x):
    return x.inner if isinstance(x, SimTensor) else x


def _leaves(tree) -> list:
    from torch.utils._pytree import tree_leaves

    return tree_leaves(tree)


class _Factories(torch.overrides.TorchFunctionMode):
    """Python calls that name the ``simgpu`` device (``torch.eye(n, device=...)``, ``torch.tensor(x, device=...)``)
    build their tensor on the CPU and wrap it, so an ``out=`` kernel that resizes its result (``eye``) gives a tensor
    of the right shape."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # inside __torch_dispatch__ every autocast key is excluded, so torch.is_autocast_enabled reads False there:
        # the device's autocast state is read here, where the Python call is made, and holds for that call
        outer = getattr(_autocast, "dtype", None)
        _autocast.dtype = torch.get_autocast_dtype(NAME) if torch.is_autocast_enabled(NAME) else None
        try:
            return self._call(func, args, kwargs or {})
        finally:
            _autocast.dtype = outer

    def _call(self, func, args, kwargs):
        if func is torch.Tensor.tolist and isinstance(args[0], SimTensor):  # as CUDA does it: a copy to the host
            return args[0].inner.tolist()
        if func is torch.Tensor.numpy and isinstance(args[0], SimTensor):
            raise TypeError(f"can't convert {NAME}:0 device type tensor to numpy. Use Tensor.cpu() first.")
        if not _is_sim_device(kwargs.get("device")) or func in (torch.Tensor.to,):
            return func(*args, **kwargs)
        out = func(*args, **{**kwargs, "device": torch.device("cpu")})
        with torch.inference_mode(False):
            return tree_map(lambda x: SimTensor(x) if type(x) is torch.Tensor else x, out)


def _register() -> None:
    """Register ``simgpu`` as PyTorch's PrivateUse1 device with a Python backend (once per process)."""
    if _registered:
        return
    from torch.utils.backend_registration import (
        _DummyBackendModule,
        _DummyPrivateUse1Hook,
        _setup_privateuseone_for_python_backend,
    )

    class Module(_DummyBackendModule):  # what torch.autocast asks of a device's module
        @staticmethod
        def get_amp_supported_dtype():
            return [torch.bfloat16, torch.float16]

        def is_available(self) -> bool:
            return bool(active)

    class Hook(_DummyPrivateUse1Hook):  # an accelerator only inside simulated_gpu (DataLoaders pin memory for it)
        def is_available(self) -> bool:
            return bool(active)

    _setup_privateuseone_for_python_backend(NAME, backend_module=Module(), hook=Hook())
    lib = torch.library.Library("aten", "IMPL")

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return SimTensor(torch.empty(size, dtype=dtype))

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return SimTensor(torch.empty_strided(size, stride, dtype=dtype))

    def copy_from(self, dst, non_blocking=False):
        src = self.inner if isinstance(self, SimTensor) else self
        (dst.inner if isinstance(dst, SimTensor) else dst).copy_(src)
        return dst

    lib.impl("empty.memory_format", empty, "PrivateUse1")
    lib.impl("empty_strided", empty_strided, "PrivateUse1")
    lib.impl("_copy_from", copy_from, "PrivateUse1")
    # what torch.autocast(simgpu) asks of the dispatcher: a kernel (here a fallthrough) for every operation under the
    # device's autocast key; the casting itself happens on the CPU (see _run)
    autocast = torch.library.Library("_", "IMPL", "AutocastPrivateUse1")
    autocast.fallback(torch.library.fallthrough_kernel)
    _registered.extend([lib, autocast])


@contextlib.contextmanager
def simulated_gpu(monkeypatch) -> Iterator[torch.device]:
    """Within the block the trainers, accelerate and sentence-transformers place models and inputs on ``simgpu``
    (see the module docstring); yields the device."""
    import accelerate
    import safetensors.torch
    import sentence_transformers
    from transformers import PreTrainedModel, TrainingArguments

    _register()
    with monkeypatch.context() as m:
        # (TrainingArguments sets up its distributed state where it first computes its device)
        m.setattr(TrainingArguments, "device", property(lambda self: (self._setup_devices, DEVICE)[1]))
        m.setattr(accelerate.Accelerator, "device", property(lambda self: DEVICE))
        for module in _device_name_users(sentence_transformers):
            m.setattr(module, "get_device_name", lambda: NAME)
        # writing weights reads tensor storages, which a simgpu tensor has not: they are written from the CPU, as the
        # libraries copy a GPU's tensors to the host to write them
        for name in ("save_file", "save"):
            m.setattr(safetensors.torch, name, _on_host(getattr(safetensors.torch, name)))
        m.setattr(PreTrainedModel, "save_pretrained", _saved_from_cpu(PreTrainedModel.save_pretrained))
        # the device has no memory cache of its own (its tensors live on the host): accelerate (1.16 and later) empties
        # a PrivateUse1 device's through torch.accelerator, which asserts a caching allocator the device lacks
        for module in _cache_clearers():
            m.setattr(module, "clear_device_cache", lambda garbage_collection=False: None)
        active.append(True)
        try:
            with _Factories():
                yield DEVICE
        finally:
            active.pop()


def _on_host(save):
    def on_host(tensors, *args, **kwargs):
        return save({k: v.inner if isinstance(v, SimTensor) else v for k, v in tensors.items()}, *args, **kwargs)

    return on_host


def _saved_from_cpu(save_pretrained):
    def saved(self, *args, **kwargs):
        on_sim = any(isinstance(p, SimTensor) for p in self.parameters())
        if on_sim:
            self.to("cpu")
        try:
            return save_pretrained(self, *args, **kwargs)
        finally:
            if on_sim:
                self.to(DEVICE)

    return saved


def _cache_clearers() -> list:
    """The modules of accelerate and transformers that bound accelerate's ``clear_device_cache``."""
    import sys

    return [
        mod
        for name, mod in list(sys.modules.items())
        if name.split(".")[0] in ("accelerate", "transformers") and hasattr(mod, "clear_device_cache")
    ]


def _device_name_users(package) -> list:
    """The modules of ``package`` that bound ``get_device_name`` (sentence-transformers' default device)."""
    import sys

    prefix = package.__name__ + "."
    return [
        mod
        for name, mod in list(sys.modules.items())
        if (name == package.__name__ or name.startswith(prefix)) and hasattr(mod, "get_device_name")
    ]


_register()
DEVICE = torch.device(NAME, 0)
