"""Fast implementations: production kernels with every batch-dependent choice pinned, and,
beside each, the unpinned baselines production uses by default (the negative controls)."""
