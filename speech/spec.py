"""The ASR and TTS pipelines' command-line faces (`mmspec.common.pipeline_spec`), with no torch: what `--set`
takes, the input flags and how each value is checked, what `--out` may name."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mmspec.common.config import count_field, field_choices, temperature_field, top_k_field, top_p_field
from mmspec.common.pipeline_spec import InputFlag, PipelineSpec, check_file, count_lines

_BUNDLED = os.path.join(os.path.dirname(__file__), "bundled")


def held_out_ceiling(folder: str, what: str, flag: str):
    """`--num` without `flag` takes the first --num of a committed held-out set: at most its size."""
    def ceiling(args):
        if getattr(args, flag.lstrip("-"), None):
            return None
        return count_lines(os.path.join(_BUNDLED, folder, "transcripts.jsonl")), f"the held-out {what}; give {flag}"
    return ceiling


# The bench's speech test sets (speech/bundled/asr_*; `--set test_set=`).
TEST_SETS = ("in_domain", "out_of_domain", "foreign", "noise")


def check_audio_file(path) -> None:
    """An existing file soundfile can read (any channel count and sample rate: the pipeline downmixes and
    resamples)."""
    import soundfile

    check_file(path)
    try:
        soundfile.info(str(path))
    except (RuntimeError, soundfile.LibsndfileError):
        raise ValueError("not an audio file soundfile can read (wav, flac, ogg, mp3)") from None


def check_text(text) -> None:
    if not str(text).strip():
        raise ValueError("empty text")


@dataclass
class ASRCallSettings:
    max_new_tokens: int = count_field(200, doc="the longest transcript, in decoder tokens")
    temperature: float = temperature_field(0.0)
    max_batch_size: int | None = count_field(None, doc="continuous batching: decode this many utterances at once, "
                                             "admitting the next as one finishes (None: batch by batch)")


@dataclass
class ASRBenchSettings:
    test_set: str = field_choices(TEST_SETS, default="in_domain", doc="the held-out speech the bench transcribes")


@dataclass
class TTSCallSettings:
    max_new_frames: int = count_field(250, doc="the longest speech, in codec frames")
    temperature: float = temperature_field(0.9, doc="backbone (codebook 0) sampling temperature (0 = greedy)")
    top_k: int | None = top_k_field(50)
    top_p: float | None = top_p_field(1.0)
    depth_temperature: float = temperature_field(0.9, doc="depth decoder (codebooks 1..) temperature")
    depth_top_k: int | None = top_k_field(50)
    depth_top_p: float | None = top_p_field(1.0)


ASR_SPEC = PipelineSpec(
    modality="speech", call_settings=ASRCallSettings, bench_settings=ASRBenchSettings,
    inputs=(InputFlag("--audio", "audio file to transcribe (repeatable; any channels and sample rate; default: "
                      "--num held-out clips)", check=check_audio_file),),
    out_suffixes=(".txt", ".json"), num_ceiling=held_out_ceiling("asr_test", "clips", "--audio"))

TTS_SPEC = PipelineSpec(
    modality="speech", call_settings=TTSCallSettings,
    inputs=(InputFlag("--text", "text to speak (repeatable; default: --num held-out sentences)", check=check_text),),
    out_suffixes=(".wav",), num_ceiling=held_out_ceiling("tts_test", "sentences", "--text"))
