"""A stand-in for a ``@triton.jit`` kernel in tests that check launch plans.

``LaunchRecorder(kernel)`` records each launch's grid and keyword arguments (the constexprs and
``num_warps``: what decides a reduction's order) as ``{"grid": grid, **kwargs}``, then runs the
real ``kernel`` if one was given; without one it only records.
"""

from __future__ import annotations

from typing import Any


class LaunchRecorder:
    def __init__(self, kernel: Any = None) -> None:
        self.kernel = kernel
        self.launches: list[dict[str, Any]] = []

    def plans(self) -> list[dict[str, Any]]:
        """Each launch's keyword arguments without its grid (the grid follows M by design)."""
        return [{k: v for k, v in launch.items() if k != "grid"} for launch in self.launches]

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.append({"grid": grid, **kwargs})
            if self.kernel is not None:
                return self.kernel[grid](*args, **kwargs)
            return None

        return launch
