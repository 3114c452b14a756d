"""Speech substrate (ASR/TTS models, pipelines, WER/RTF): arrives with the speech issues."""
