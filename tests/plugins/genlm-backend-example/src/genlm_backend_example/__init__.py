"""An example third-party GenLM backend."""
