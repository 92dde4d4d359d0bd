"""Reference implementations: slow, obviously correct torch code (stable sorts on integer keys,
fp64 accumulation, explicit loops).  They run on CPU or GPU and define what the fast kernels
must compute."""
