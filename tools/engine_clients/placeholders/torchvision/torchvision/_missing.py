"""Names of the placeholder: importable, raising when used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Missing:
    """A name torchvision would have; calling it (or anything under it) raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name}: this virtualenv has an import-only torchvision placeholder "
            "(kvfs .ci/engines sglang); install a torchvision build matching its torch to use it"
        )

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


def module_getattr(module: str) -> Callable[[str], Missing]:
    def __getattr__(name: str) -> Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{module}.{name}")

    return __getattr__
