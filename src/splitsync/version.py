"""The package version, in the lowest layer so that every layer may report it."""

__version__ = "0.1.0"
