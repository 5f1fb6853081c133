"""Where a mount's daemon can be reached: :mod:`kvfs.runtime`, re-exported for the daemon
and the tools (the core holds it so that :mod:`kvfs.client` needs no mount package)."""

from kvfs import runtime as _runtime
from kvfs.runtime import *  # exactly the names of kvfs.runtime.__all__

__all__ = list(_runtime.__all__)

_key = _runtime.mount_key  # the name older scripts and tests use
