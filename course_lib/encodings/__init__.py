"""The position encodings of the course: one file each, all in one registry.

Each module of this package is one encoding: its formula in plain PyTorch, its attention module
(its parameters, and what it adds to the inputs), its kernel hooks, and the :class:`Encoding`
record that ties them together, registered in :data:`REGISTRY` (see :mod:`course_lib.registry`
for what a record holds). Every module here is imported when the package is, and the names in
each module's ``__all__`` are available from ``course_lib.encodings`` directly (e.g.
``course_lib.encodings.apply_rope``). Adding an encoding is adding a file here.

Shapes: ``x`` is ``[..., seq, head_dim]`` (usually ``[batch, heads, seq, head_dim]``);
``position_ids`` are integer ``[seq]`` or ``[batch, seq]``. Everything is vectorised over
positions and keys (no Python loops over them).
"""

from __future__ import annotations

import importlib
import pkgutil

from course_lib.registry import REGISTRY, Encoding, get_encoding, register

__all__ = ["REGISTRY", "Encoding", "get_encoding", "register"]


def _import_encoding_modules() -> None:
    """Import every module of this package (each registers its encoding) and re-export the
    names of its ``__all__``."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name in getattr(module, "__all__", ()):
            globals()[name] = getattr(module, name)
            __all__.append(name)


_import_encoding_modules()
