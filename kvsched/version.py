"""kvsched's version (its own module, so any layer may read it without
importing the package's front door)."""

__version__ = "0.1.0"
