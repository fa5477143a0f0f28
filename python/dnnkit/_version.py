"""The package version (one place: setup.py reads it too)."""
__version__ = "0.2.0"
