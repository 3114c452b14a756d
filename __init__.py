"""mmspec: speculative, Jacobi and parallel decoding for autoregressive image, speech and document generators."""

from .common.registry import list_plugins, load_plugin, register_plugin

__version__ = "0.1.0"
__all__ = ["list_plugins", "load_plugin", "register_plugin", "__version__"]
