"""Test shims: the torch 2.x names tokenspeed uses, on Debian's torch 1.13 (CPU), so that its
modules import and its CPU cache pools run. None of them is exercised by the transfer."""

import torch


class _MissingDtype:
    """A torch 2.x dtype torch 1.13 lacks: equal only to itself."""

    def __init__(self, name):
        self.name = name
        self.itemsize = 1
        self.is_floating_point = True

    def __repr__(self):
        return "torch." + self.name


def install():
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                 "float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64"):
        if not hasattr(torch, name):
            setattr(torch, name, _MissingDtype(name))
    if not hasattr(torch, "compile"):
        def compile(model=None, **kwargs):  # noqa: A001 - torch's name
            if model is None:
                return lambda fn: fn
            return model
        torch.compile = compile
    if not hasattr(torch.Tensor, "untyped_storage"):
        torch.Tensor.untyped_storage = torch.Tensor.storage
    if not hasattr(torch.Tensor, "nbytes"):
        torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())
    if not hasattr(torch, "get_device_module"):
        torch.get_device_module = lambda device=None: torch.cuda
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        def custom_op(*args, **kwargs):
            def wrap(fn):
                fn.register_fake = lambda f: f
                return fn
            return wrap
        torch.library.custom_op = custom_op
