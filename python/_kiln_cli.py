"""The ``kiln`` command of the installed wheel: runs the C++ executable shipped in ``kiln/bin/``.

``kiln inspect|run|bench|report|compile|generate ...`` (``kiln --help``); the Python commands
(export, export-llm, ...) stay ``python -m kiln``. A top-level module, not part of the ``kiln``
package, so that starting the command does not import the package (numpy, the binding, libmlx):
it only finds two folders and replaces this process with the executable. In a source checkout
the executable is ``build/tools/kiln``.
"""
from __future__ import annotations

import importlib.util
import os
import sys


def _package_dir(name: str) -> str | None:
    """Folder of the installed package `name` without importing it; None when it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def executable() -> str:
    """Path of the C++ ``kiln`` executable inside the installed package (kiln/bin/kiln).

    Raises FileNotFoundError when it is not there (a source checkout on PYTHONPATH has no kiln/bin/:
    run build/tools/kiln there)."""
    kiln_dir = _package_dir("kiln")
    path = os.path.join(kiln_dir, "bin", "kiln") if kiln_dir else "kiln/bin/kiln"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path}: the kiln executable is not in this installation (install the wheel: "
                                "pip install . ; in a source checkout run build/tools/kiln)")
    return path


def main() -> int:
    """Entry point of the ``kiln`` console script: replaces this process with the executable (same
    arguments and exit status). The executable finds libmlx through its RPATH when the mlx package
    sits beside kiln; when mlx is installed in another site directory, that package's lib/ folder is
    added to LD_LIBRARY_PATH first. Exit 127 with a message when the executable is missing."""
    try:
        exe = executable()
    except FileNotFoundError as e:
        print(f"kiln: {e}", file=sys.stderr)
        return 127
    env = os.environ
    mlx_dir = _package_dir("mlx")
    if mlx_dir and os.path.isdir(os.path.join(mlx_dir, "lib")):
        lib = os.path.join(mlx_dir, "lib")
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(p for p in (lib, os.environ.get("LD_LIBRARY_PATH")) if p))
    os.execve(exe, [exe, *sys.argv[1:]], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
