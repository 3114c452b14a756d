"""mmspec: speculative, Jacobi and parallel decoding for autoregressive image, speech and document generators."""

# Absolute, not relative: pytest imports this file by path (under the checkout folder's name) when it
# collects tests, and a relative import would fail there.
from mmspec.common.registry import (PluginSummary, declare_plugin_summaries, list_plugins, load_plugin,
                                    register_builtin_modules, register_plugin)

# The package's own modalities and plugins, imported when a registry is first used. Each modality package
# registers its pipelines and bundled models on import (lazily: no heavy import until one is used), so
# the core (`mmspec.common`) names none of them; third parties use the entry-point groups instead.
register_builtin_modules(
    "mmspec.text", "mmspec.vision", "mmspec.speech", "mmspec.docs_parse",
    "mmspec.plugins.ar", "mmspec.plugins.speculative", "mmspec.plugins.jacobi", "mmspec.plugins.zipar",
    "mmspec.plugins.ssd", "mmspec.plugins.lantern", "mmspec.plugins.ctc_draft", "mmspec.plugins.rvq_spec",
    "mmspec.plugins.ptp",
)

# What `mmspec list` and `--help` show without importing torch (tests/common/test_cli_light.py checks each
# line against the plugin class it describes).
declare_plugin_summaries(
    PluginSummary("ar", "any", True, "baseline"),
    PluginSummary("ctc_draft", "speech", True, "arXiv:2603.11243"),
    PluginSummary("eagle", "vision", True,
                  "Li et al. 2024, EAGLE (arXiv:2401.15077), the drafter of LANTERN (arXiv:2410.03355)"),
    PluginSummary("gsd", "vision", False, "So et al. 2025, Grouped Speculative Decoding (ICCV 2025, arXiv:2508.07747)"),
    PluginSummary("lantern", "vision", False,
                  "LANTERN, relaxed speculative decoding for image AR models (ICLR 2025, arXiv:2410.03355)"),
    PluginSummary("lantern++", "vision", False,
                  "LANTERN++, static-tree drafting with a multiplicative relaxation (arXiv:2502.06352)"),
    PluginSummary("mc_sjd", "vision", True, "So et al. 2025, MC-SJD / Speculative Coupled Decoding (arXiv:2510.24211)"),
    PluginSummary("ptp", "docs", True,
                  "PTP, parallel-token prediction with register tokens (arXiv:2603.15206); scheme in plugins/ptp"),
    PluginSummary("rvq_spec", "speech", True, "RVQ Position Aware Speculative Decoding for On-Device TTS (Argmax); "
                  "TensorRT-Edge-LLM CodePredictor speculative decoding"),
    PluginSummary("sjd", "vision", True, "Teng et al. 2025, Speculative Jacobi Decoding (arXiv:2410.01699)"),
    PluginSummary("speculative", "text", True,
                  "Leviathan et al. 2023 / Chen et al. 2023 (arXiv:2211.17192, 2302.01318)"),
    PluginSummary("ssd", "vision", True,
                  "SSD, spatially speculative decoding (arXiv:2606.20543); heads and drafting as in plugins/ssd"),
    PluginSummary("zipar", "vision", False, "He et al. 2025, ZipAR: next-set decoding (ICML 2025, arXiv:2412.04062)"),
)

__version__ = "0.1.0"
__all__ = ["list_plugins", "load_plugin", "register_plugin", "__version__"]
