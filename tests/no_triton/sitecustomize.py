"""On PYTHONPATH, makes ``import triton`` fail as it does where triton is not installed (a Mac): every Python process
started with this folder on its path, notebook kernels included, finds no triton. With HIDE_TRITON_EXCEPT=NAME, a
process whose working folder is named NAME (nbgrader runs each notebook in its own folder) still finds it."""

import os
import sys


class _NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if os.path.basename(os.getcwd()) != os.environ.get("HIDE_TRITON_EXCEPT"):
    sys.meta_path.insert(0, _NoTriton())
