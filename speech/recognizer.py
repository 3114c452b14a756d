"""Speech recognizers: what `ASRPipeline` and the `ctc_draft` plugin need from an ASR model.

A recognizer encodes a batch of 16 kHz waveforms once and exposes two heads on the result:

- a CTC head (the drafter): logits [B, T, V_ctc], their blank id, and CTC ids -> text;
- an autoregressive decoder (the verifier) as an `ARModel` over the encoded batch, with its prompt,
  its end-of-text id and text <-> decoder ids.

`BundledRecognizer` is the project's own model (one vocabulary for both heads). The Hugging Face pair
(`Wav2Vec2ForCTC` drafter, `WhisperForConditionalGeneration` verifier) lives in `speech.hf`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..common.model import ARModel
from .asr_model import ASRDecoderAdapter, ASRModel, EncoderOutput
from .text import CharTokenizer

BUNDLED_ASR_DIR = Path(__file__).resolve().parent / "bundled" / "asr_tiny"


@dataclass
class EncodedSpeech:
    ctc_logits: torch.Tensor  # [B, T, V_ctc] float32
    ctc_lengths: torch.Tensor  # [B] long valid CTC frames per row
    decoder_context: Any  # whatever the recognizer's decoder adapter is built from (encoder states)


class SpeechRecognizer:
    """Interface; see the module docstring."""

    ctc_blank_id: int
    eos_token_id: int
    shares_vocabulary: bool  # True: CTC ids are decoder ids (no re-tokenization)
    device: torch.device
    name: str
    word_boundary_ids: tuple = ()  # decoder ids that separate words (lets `ctc_draft` re-align after a merge)
    # Long-form audio (`mmspec.speech.segment`): the longest piece the model takes, and the pause at which a
    # recording is always cut (a model trained on single sentences stops after the first one); None: no limit.
    max_input_seconds: float | None = None
    pause_seconds: float | None = None

    def assisted_generation(self, waves, num_samples, assistant, max_new_tokens: int) -> dict:
        """`transformers` assisted generation with `assistant` (a bench peer); only Whisper has it."""
        raise NotImplementedError(f"{type(self).__name__} has no assisted-generation peer")

    def encode(self, waves: torch.Tensor, num_samples: torch.Tensor) -> EncodedSpeech:
        """waves [B, N] float32 16 kHz zero-padded, num_samples [B]."""
        raise NotImplementedError

    def decoder(self, encoded: EncodedSpeech, rows: torch.Tensor | None = None) -> ARModel:
        """The decoder as an adapter over the encoded batch (rows [B'] long: only those utterances)."""
        raise NotImplementedError

    def join_encoded(self, parts: list[EncodedSpeech]) -> EncodedSpeech:
        """Several encoded batches as one (their rows in order, padded to the longest): continuous batching
        decodes a whole call's utterances while the encoder runs in batches. Recognizers that cannot leave
        this unimplemented, and their pipeline decodes batch after batch."""
        raise NotImplementedError(f"{type(self).__name__} cannot join encoded batches")

    def continuous_batching_blocker(self) -> str | None:
        """None when this recognizer's decoder admits utterances into a running batch, else why not."""
        if type(self).join_encoded is SpeechRecognizer.join_encoded:
            return f"{type(self).__name__} cannot join encoded batches (join_encoded)"
        return None

    def prompt_ids(self) -> list[int]:
        """Decoder tokens before the transcript (e.g. <s>, or Whisper's task tokens)."""
        raise NotImplementedError

    def ctc_to_text(self, ids: list[int]) -> str:
        raise NotImplementedError

    def text_to_decoder_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def decoder_ids_to_text(self, ids: list[int]) -> str:
        raise NotImplementedError

    def ctc_to_decoder_ids(self, ids: list[int]) -> list[int]:
        """A CTC hypothesis as decoder ids: the same ids when the vocabularies agree, else re-tokenized text."""
        return list(ids) if self.shares_vocabulary else self.text_to_decoder_ids(self.ctc_to_text(ids))


class BundledRecognizer(SpeechRecognizer):
    """`ASRModel` + `CharTokenizer`: one encoder pass feeds both the CTC head and the decoder."""

    shares_vocabulary = True
    # Trained on single sentences of 1-7 s: longer pieces and second sentences are out of its reach. A 0.4 s
    # pause splits none of the 200 held-out clips (0.3 s splits two, at commas).
    max_input_seconds = 8.0
    pause_seconds = 0.4

    def __init__(self, model: ASRModel, tokenizer: CharTokenizer | None = None, name: str = "asr-tiny"):
        self.model = model.eval()
        self.tokenizer = tokenizer or CharTokenizer()
        if self.tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"tokenizer has {self.tokenizer.vocab_size} ids, model {model.config.vocab_size}")
        self.ctc_blank_id = self.tokenizer.blank_id
        self.word_boundary_ids = tuple(self.tokenizer.encode("a b")[1:2])  # the space character
        self.eos_token_id = self.tokenizer.eos_id
        self.device = next(model.parameters()).device
        self.name = name

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike = BUNDLED_ASR_DIR, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "BundledRecognizer":
        directory = Path(directory)
        if not (directory / "config.json").exists():
            raise FileNotFoundError(f"no ASR model in {directory}: train one with examples/train_asr.py")
        model = ASRModel.from_pretrained(str(directory), torch_dtype=dtype).to(device)
        return cls(model, CharTokenizer.from_pretrained(str(directory)), name=directory.name.replace("_", "-"))

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        self.model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))

    def encode(self, waves, num_samples):
        dtype = next(self.model.parameters()).dtype
        out = self.model.encode(waves.to(self.device), num_samples.to(self.device))
        out.memory = out.memory.to(dtype)
        return EncodedSpeech(out.ctc_logits, out.lengths, out)

    def decoder(self, encoded, rows=None):
        context = encoded.decoder_context
        if rows is not None:
            rows = rows.to(context.memory.device)
            context = EncoderOutput(context.ctc_logits[rows], context.memory[rows], context.lengths[rows])
        return ASRDecoderAdapter(self.model, context)

    def join_encoded(self, parts):
        width = max(p.ctc_logits.shape[1] for p in parts)

        def stack(tensors):  # [B, T, ...] each -> [sum B, width, ...], zero frames past each part's own
            return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[1])) for t in tensors])

        contexts = [p.decoder_context for p in parts]
        ctc_logits = stack([p.ctc_logits for p in parts])
        lengths = torch.cat([p.ctc_lengths for p in parts])
        context = EncoderOutput(ctc_logits, stack([c.memory for c in contexts]), torch.cat([c.lengths for c in contexts]))
        return EncodedSpeech(ctc_logits, lengths, context)

    def prompt_ids(self):
        return [self.tokenizer.bos_id]

    def ctc_to_text(self, ids):
        return self.tokenizer.decode(ids)

    def text_to_decoder_ids(self, text):
        return self.tokenizer.encode(text)

    def decoder_ids_to_text(self, ids):
        return self.tokenizer.decode(ids)
