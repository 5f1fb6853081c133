"""Import-only torchvision placeholder (see pyproject.toml)."""

from ._missing import module_getattr

__version__ = "0.0.0"
__getattr__ = module_getattr(__name__)
