"""Declarative sweep files (TOML), packaged as tsbatch._sweeps."""
