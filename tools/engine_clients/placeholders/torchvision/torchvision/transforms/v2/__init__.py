"""Import-only torchvision placeholder."""

from ..._missing import module_getattr

__getattr__ = module_getattr(__name__)
