"""Building a plugin's decoder without a pipeline: the DecodeRequest a pipeline would hand it."""

from mmspec.common.plugin import DecodeRequest
from mmspec.common.structure import CodeGrid, TokenSequence


def build_decoder(plugin, target, logits, grid=None, pipeline=None, **request):
    """plugin.build_decoder for `target` with the structure of a (rows, cols) grid, or a plain sequence."""
    structure = TokenSequence() if grid is None else CodeGrid(*grid)
    return plugin.build_decoder(pipeline, DecodeRequest(target, logits, structure, **request))
