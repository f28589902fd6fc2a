"""gem_data: the GEM input pipeline."""
__version__ = "0.1.0"
__all__ = ["__version__"]
