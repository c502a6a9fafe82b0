"""Registers redis-tb's "token-bucket" strategy when the `limits` package loads its strategies, so that
Flask-Limiter and slowapi find it by configuration alone, without an import in the application.

`redis-tb.pth` (installed next to this module) imports it at interpreter start. It only adds a finder to
`sys.meta_path`: nothing else is imported until some code imports `limits.strategies`, and then the strategy is
added to `limits.strategies.STRATEGIES` right after that module has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

TARGET = "limits.strategies"


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            from redis_tb.limits import register
        except ImportError:  # redis-py missing, or a broken install: limits works as before
            return
        register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


def install() -> None:
    if TARGET in sys.modules:  # limits already loaded (unusual at startup): register now
        try:
            from redis_tb.limits import register
        except ImportError:
            return
        register()
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
