"""What ASR pipelines offer plugins: their token structure and the DecodeStats counters they keep.

Light on purpose (no audio libraries): plugin modules import it when the registry is first used.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.structure import TokenSequence

# DecodeStats.extra counters of speech pipelines.
AUDIO_SECONDS = "audio_seconds"  # seconds of input audio, for real-time factors
GATED_ROWS = "gated_rows"  # utterances a gate finished before the decoder ran (e.g. CTC entropy)
# ... of TTS pipelines (the DecodeStats rows themselves are depth-decoder frames).
FRAMES = "frames"  # codec frames generated (each one backbone step and one depth-decoder decode)
BACKBONE_NFE = "backbone_nfe"  # backbone forwards (prompt prefill included)
TIME_BACKBONE = "time_backbone_s"  # wall time in the backbone (forwards and codebook-0 sampling)
TIME_DEPTH = "time_depth_s"  # wall time in the depth decoder (the plugin's decoder, per frame)
TIME_CODEC = "time_codec_s"  # wall time turning codes into audio
AUDIO_OUT_SECONDS = "audio_out_seconds"  # seconds of audio produced
UNFINISHED_ROWS = "unfinished_rows"  # texts that reached max_new_frames before end of speech


@dataclass(frozen=True, eq=False)
class CTCTranscript(TokenSequence):
    """A transcript decoded over an acoustic encoder that also has a CTC head: the batch's `EncodedSpeech`
    (`DecodeRequest.conditioning`) carries CTC posteriors a plugin can draft from (`ctc_draft`)."""
