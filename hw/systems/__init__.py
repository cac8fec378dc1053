"""Multi-GPU system files (TOML), packaged as tsbatch._hw.systems."""
