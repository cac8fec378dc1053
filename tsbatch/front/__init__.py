"""The front doors: the command line, the Python API, the Triton adapter, the Ray engine, explanations."""
