"""Import-only torchvision placeholder: ``InterpolationMode`` is a real enum (module-level
code of its importers reads its members); every other name raises when used."""

import enum

from .._missing import module_getattr

__getattr__ = module_getattr(__name__)


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"
