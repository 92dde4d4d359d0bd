"""Only ``@triton.jit`` code lives here; launchers (validation, config, grid) live in ``fast/``."""
