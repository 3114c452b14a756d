"""What ASR pipelines offer plugins: their token structure and the DecodeStats counters they keep.

Light on purpose (no audio libraries): plugin modules import it when the registry is first used.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.structure import TokenSequence

# DecodeStats.extra counters of speech pipelines.
AUDIO_SECONDS = "audio_seconds"  # seconds of input audio, for real-time factors
GATED_ROWS = "gated_rows"  # utterances a gate finished before the decoder ran (e.g. CTC entropy)


@dataclass(frozen=True, eq=False)
class CTCTranscript(TokenSequence):
    """A transcript decoded over an acoustic encoder that also has a CTC head: the batch's `EncodedSpeech`
    (`DecodeRequest.conditioning`) carries CTC posteriors a plugin can draft from (`ctc_draft`)."""
