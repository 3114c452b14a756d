"""mmspec: speculative, Jacobi and parallel decoding for autoregressive image, speech and document generators."""

# Absolute, not relative: pytest imports this file by path (under the checkout folder's name) when it
# collects tests, and a relative import would fail there.
from mmspec.common.loading import load_plugin
from mmspec.common.registry import (PluginSummary, declare_plugin_summaries, list_plugins, register_builtin_modules,
                                    register_plugin)

# The package's own modalities, imported when a registry is first used. Each registers its pipelines and bundled
# models on import (lazily: no heavy import until one is used), so the core (`mmspec.common`) names none of them;
# third parties use the entry-point groups instead.
register_builtin_modules("mmspec.text", "mmspec.vision", "mmspec.speech", "mmspec.docs_parse")


def _plugin(name: str, modality: str, lossless: bool, paper: str, package: str, config: str | None = None,
            default_model: str | None = None, *, method: str, lossless_text: str | None = None) -> PluginSummary:
    """The package's own plugin `name`: registered by plugins/<package>/plugin.py (imported when the plugin is
    first used), its config class in plugins/<package>/config.py (no torch)."""
    where = f"mmspec.plugins.{package}"
    return PluginSummary(name, modality, lossless, paper, module=f"{where}.plugin",
                         config=config and f"{where}.config:{config}", default_model=default_model, method=method,
                         lossless_text=lossless_text)


# The one table of the package's own plugins: what `mmspec list` and `--help` show (and `mmspec list --markdown`,
# the README's plugin table), what the CLI checks `--set` against before torch loads, and where each plugin is
# registered (tests/common/test_registry.py checks each line
# against the plugin class it describes, and that every plugin module is declared here).
declare_plugin_summaries(
    _plugin("ar", "any", True, "baseline", "ar",
            method='plain autoregressive decoding through the same loop (the baseline)'),
    _plugin("ctc_draft", "speech", True, "arXiv:2603.11243", "ctc_draft", "CTCDraftConfig",
            method="self-speculative ASR: the CTC head's greedy hypothesis is verified by the decoder in one pass "
                   '(entropy gate, `strict` / `relaxed` / `ctc` modes)', lossless_text='strict: yes'),
    _plugin("eagle", "vision", True,
            "Li et al. 2024, EAGLE (arXiv:2401.15077), the drafter of LANTERN (arXiv:2410.03355)", "lantern",
            "EagleConfig",
            method="an EAGLE head (one layer on the target's features) drafts chains or static trees; strict "
                   'acceptance'),
    _plugin("gsd", "vision", False, "So et al. 2025, Grouped Speculative Decoding (ICCV 2025, arXiv:2508.07747)",
            "jacobi", "GSDConfig",
            method='Grouped Speculative Decoding: SJD accepting by the pooled probability of a dynamic token group'),
    _plugin("lantern", "vision", False,
            "LANTERN, relaxed speculative decoding for image AR models (ICLR 2025, arXiv:2410.03355)", "lantern",
            "LanternConfig",
            method='LANTERN: `eagle` drafts accepted against a relaxed target that pools latent neighbours (TV ≤ δ)'),
    _plugin("lantern++", "vision", False,
            "LANTERN++, static-tree drafting with a multiplicative relaxation (arXiv:2502.06352)", "lantern",
            "LanternPPConfig",
            method='LANTERN++: static-tree `eagle` drafts, relaxation capped multiplicatively (p̃(x) ≤ λ·p(x))'),
    _plugin("mc_sjd", "vision", True, "So et al. 2025, MC-SJD / Speculative Coupled Decoding (arXiv:2510.24211)",
            "jacobi", "MCSJDConfig",
            method='SJD with coupled redraws (maximal or Gumbel coupling): drafts stop changing once their context '
                   'settles'),
    _plugin("ptp", "docs", True,
            "PTP, parallel-token prediction with register tokens (arXiv:2603.15206); scheme in plugins/ptp", "ptp",
            "PTPConfig", default_model="doc-tiny",
            method='parallel-token prediction: k learned register tokens ride along each verify pass (invisible to '
                   'ordinary tokens) and draft the next k tokens; optional structure-copy drafts up to 64 tokens; '
                   'greedy match or speculative sampling'),
    _plugin("rvq_spec", "speech", True, "RVQ Position Aware Speculative Decoding for On-Device TTS (Argmax); "
            "TensorRT-Edge-LLM CodePredictor speculative decoding", "rvq_spec", "RVQSpecConfig",
            default_model="tts-tiny",
            method='RVQ position-aware speculation of a TTS depth decoder: the frozen heads of later code levels on '
                   "the newest state + learned offsets draft a frame's next codes, verified in one depth-decoder call"
                   ' (chains or static trees; exact under top-k / top-p sampling)'),
    _plugin("sjd", "vision", True, "Teng et al. 2025, Speculative Jacobi Decoding (arXiv:2410.01699)", "jacobi",
            "SJDConfig",
            method='Speculative Jacobi Decoding: the target refines a window of its own guesses, probabilistic '
                   'acceptance'),
    _plugin("speculative", "text", True, "Leviathan et al. 2023 / Chen et al. 2023 (arXiv:2211.17192, 2302.01318)",
            "speculative", "SpeculativeConfig",
            method='separate draft model; greedy match or Leviathan/Chen speculative sampling; chain, static tree or '
                   'dynamic (EAGLE-2) tree'),
    _plugin("ssd", "vision", True,
            "SSD, spatially speculative decoding (arXiv:2606.20543); heads and drafting as in plugins/ssd", "ssd",
            "SSDConfig",
            method='spatial speculative decoding: trained right/below heads draft from the verified row above'),
    _plugin("zipar", "vision", False, "He et al. 2025, ZipAR: next-set decoding (ICML 2025, arXiv:2412.04062)",
            "zipar", "ZipARConfig",
            method='ZipAR next-set decoding (rows in parallel); `mode=verified` makes the parallel tokens drafts '
                   '(lossless)', lossless_text='no / yes'),
)

__version__ = "0.1.0"
__all__ = ["list_plugins", "load_plugin", "register_plugin", "__version__"]
