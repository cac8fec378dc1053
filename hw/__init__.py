"""GPU specification files (TOML), packaged as tsbatch._hw."""
