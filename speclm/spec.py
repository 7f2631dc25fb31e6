"""Deprecated alias of `speclm.speculative` (renamed; kept for one release).

`import speclm.spec.loop` and `from speclm.spec.controller import ...` keep
working and warn; import from `speclm.speculative` instead.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings

from . import speculative as _speculative

warnings.warn("speclm.spec is renamed speclm.speculative; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

for _info in pkgutil.walk_packages(_speculative.__path__, "speclm.speculative."):
    _module = importlib.import_module(_info.name)
    sys.modules["speclm.spec." + _info.name.removeprefix("speclm.speculative.")] = _module

__path__: list[str] = []  # a package, so `import speclm.spec.loop` resolves through sys.modules
