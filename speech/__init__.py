"""Speech substrate: the bundled CTC + attention-decoder ASR model, `ASRPipeline`, the bundled RVQ codec and
codec TTS model, `TTSPipeline`, Hugging Face adapters
(Whisper verifier, Wav2Vec2 CTC drafter), synthesized speech data and WER / RTF metrics."""

from mmspec.common.registry import register_bundled_model, register_pipeline

register_pipeline("asr", "mmspec.speech.pipeline:ASRPipeline", spec="mmspec.speech.spec:ASR_SPEC")
register_pipeline("tts", "mmspec.speech.tts_pipeline:TTSPipeline", spec="mmspec.speech.spec:TTS_SPEC")
register_bundled_model("asr-tiny", "mmspec.speech.pipeline:bundled_pipeline", modality="speech", default=True,
                       pipeline="asr")
# Text to speech: a small CSM (backbone + depth decoder) over the bundled RVQ spectral codec, Piper speech.
register_bundled_model("tts-tiny", "mmspec.speech.tts_pipeline:bundled_pipeline", modality="speech", pipeline="tts",
                       bench_ar_rows=({},))  # its quality block (judge WER, MCD) and time split
# Random tiny Whisper + Wav2Vec2 (no weights download here): exercises the Hugging Face adapters.
register_bundled_model("whisper-tiny-random", "mmspec.speech.hf:tiny_random_pipeline", modality="speech",
                       pipeline="asr")
