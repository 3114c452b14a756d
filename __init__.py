"""mmspec: speculative, Jacobi and parallel decoding for autoregressive image, speech and document generators."""

# Absolute, not relative: pytest imports this file by path (under the checkout folder's name) when it
# collects tests, and a relative import would fail there.
from mmspec.common.registry import list_plugins, load_plugin, register_builtin_modules, register_plugin

# The package's own modalities and plugins, imported when a registry is first used. Each modality package
# registers its pipelines and bundled models on import (lazily: no heavy import until one is used), so
# the core (`mmspec.common`) names none of them; third parties use the entry-point groups instead.
register_builtin_modules(
    "mmspec.text", "mmspec.vision", "mmspec.speech", "mmspec.docs_parse",
    "mmspec.plugins.ar", "mmspec.plugins.speculative", "mmspec.plugins.jacobi", "mmspec.plugins.zipar",
    "mmspec.plugins.ssd", "mmspec.plugins.lantern", "mmspec.plugins.ctc_draft", "mmspec.plugins.rvq_spec",
    "mmspec.plugins.ptp",
)

__version__ = "0.1.0"
__all__ = ["list_plugins", "load_plugin", "register_plugin", "__version__"]
