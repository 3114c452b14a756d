"""Speech substrate: the bundled CTC + attention-decoder ASR model, `ASRPipeline`, Hugging Face adapters
(Whisper verifier, Wav2Vec2 CTC drafter), espeak-ng data and WER / RTF metrics."""
