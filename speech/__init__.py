"""Speech substrate: the bundled CTC + attention-decoder ASR model, `ASRPipeline`, Hugging Face adapters
(Whisper verifier, Wav2Vec2 CTC drafter), synthesized speech data and WER / RTF metrics."""

from mmspec.common.registry import register_bundled_model, register_pipeline

register_pipeline("asr", "mmspec.speech.pipeline:ASRPipeline")
register_bundled_model("asr-tiny", "mmspec.speech.pipeline:bundled_pipeline", modality="speech", default=True)
# Random tiny Whisper + Wav2Vec2 (no weights download here): exercises the Hugging Face adapters.
register_bundled_model("whisper-tiny-random", "mmspec.speech.hf:tiny_random_pipeline", modality="speech")
