"""Tools around the core: convert (DFlash checkpoints to GGUF), hftarget (a Hugging Face directory as a
conversion target), quantize, download (Hugging Face Hub), pypi_models (the PyPI model catalog) and synth
(synthetic models). They use the core; the core never imports them."""
