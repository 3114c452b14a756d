"""mmspec: speculative, Jacobi and parallel decoding for autoregressive image, speech and document generators."""

# Absolute, not relative: pytest imports this file by path (under the checkout folder's name) when it
# collects tests, and a relative import would fail there.
from mmspec.common.registry import list_plugins, load_plugin, register_plugin

__version__ = "0.1.0"
__all__ = ["list_plugins", "load_plugin", "register_plugin", "__version__"]
