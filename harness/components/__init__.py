"""One module per registered component; each defines ``COMPONENT``."""
