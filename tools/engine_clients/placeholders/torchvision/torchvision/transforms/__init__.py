"""Import-only torchvision placeholder."""

from torchvision._missing import module_getattr

__getattr__ = module_getattr(__name__)

from torchvision.transforms.functional import InterpolationMode  # noqa: F401
