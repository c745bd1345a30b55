"""Test stubs for what tokenspeed imports but a CPU test never runs (GPU kernels, their
platform probes, quantisation configs): every attribute of a lenient module is a placeholder
class, which can be called (as a decorator it hands the function back), subscripted, and is
false. `install(names)` serves every module under those top-level names so."""

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(type):
    def __new__(mcs, name, bases, namespace, **kwargs):  # class keywords (msgspec's) ignored
        return super().__new__(mcs, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return placeholder(name)

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # a decorator: the function itself
        return placeholder(cls.__name__ + "()")

    def __getitem__(cls, item):
        return placeholder(cls.__name__ + "[]")

    def __bool__(cls):
        return False

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        return placeholder("union")

    __ror__ = __or__

    def __int__(cls):
        return 0

    def __index__(cls):
        return 0

    def __mro_entries__(cls, bases):
        return (_Base,)


class _Base:
    """What a class derived from a placeholder derives from: it takes any class keywords."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        pass


def placeholder(name):
    return _Placeholder(name, (_Base,), {})


class _LenientModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = placeholder(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _LenientModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(names):
    sys.meta_path.insert(0, _Finder(names))
