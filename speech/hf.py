"""Hugging Face speech models as `ctc_draft` parts: `Wav2Vec2ForCTC` drafts, `WhisperForConditionalGeneration`
verifies.

The two have different vocabularies, so a CTC hypothesis is turned into text (characters, ``|`` as the
word delimiter) and re-tokenized with the Whisper tokenizer before verification — the grapheme path of
the paper's notebooks. Any object with the `transformers` tokenizer methods ``encode(text,
add_special_tokens=False)`` and ``decode(ids, skip_special_tokens=True)`` works as the Whisper tokenizer.

    from transformers import WhisperForConditionalGeneration, WhisperTokenizer, Wav2Vec2ForCTC, Wav2Vec2CTCTokenizer
    recognizer = HFSpeechRecognizer(WhisperForConditionalGeneration.from_pretrained(...), WhisperTokenizer...,
                                    Wav2Vec2ForCTC.from_pretrained(...), wav2vec2_tokenizer.convert_ids_to_tokens)
    pipe = load_plugin("ctc_draft", pipeline=ASRPipeline(recognizer))
"""

from __future__ import annotations

import time

import torch

from ..common.model import ARModel, DecodeState, EncoderDecoderRows, ModelOutput, hf_cache_kwarg
from ..common.slots import SlotTable
from .recognizer import EncodedSpeech, SpeechRecognizer


class WhisperDecoderAdapter(EncoderDecoderRows, ARModel):
    """Whisper's decoder over precomputed encoder states; the self-attention cache is the core's."""

    def __init__(self, model, encoder_states: torch.Tensor, compact_slack: int = 64):
        self.model = model
        self.decoder = model.model.decoder
        self.config = model.config
        self.vocab_size = model.proj_out.weight.shape[0]
        self.device = encoder_states.device
        self.compact_slack = compact_slack
        self._encoder_states = encoder_states
        self._cache_kwarg = hf_cache_kwarg(self.decoder)

    def mask_dtype(self):
        return next(self.model.parameters()).dtype

    def token_embeddings(self):
        return self.decoder.embed_tokens.weight

    def output_logits(self, hidden):
        return self.model.proj_out(hidden).float()

    def new_state(self, batch_size):
        from transformers import DynamicCache, EncoderDecoderCache

        if batch_size != self._encoder_states.shape[0]:
            raise ValueError(f"batch of {batch_size} rows for {self._encoder_states.shape[0]} encoded utterances")
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return DecodeState(cache=cache, slots=SlotTable.empty(batch_size, self.device),
                           extra={"encoder_states": self._encoder_states})

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        if int(positions.max()) >= self.config.max_target_positions:
            raise ValueError(f"decoder position {int(positions.max())} beyond Whisper's max_target_positions "
                             f"{self.config.max_target_positions}: lower max_new_tokens")
        out = self.decoder(input_ids=tokens.to(self.device), attention_mask=mask4d.to(self.device),
                           encoder_hidden_states=state.extra["encoder_states"], position_ids=positions.to(self.device),
                           use_cache=True, **{self._cache_kwarg: state.cache})
        hidden = out.last_hidden_state
        return ModelOutput(logits=self.model.proj_out(hidden).float(), hidden=hidden if output_hidden else None)



class HFSpeechRecognizer(SpeechRecognizer):
    """Whisper verifier + Wav2Vec2 CTC drafter (see module docstring).

    ctc_vocabulary: the drafter's id -> token string (e.g. ``Wav2Vec2CTCTokenizer.convert_ids_to_tokens``
    over its vocabulary, as a list); ``|`` is a word boundary and ``<...>`` tokens are dropped.
    prompt_ids: Whisper's decoder prompt (start of transcript, language, task, no timestamps); default
    ``[decoder_start_token_id]``. text_prefix: prepended to CTC text before re-tokenization (Whisper
    transcripts start with a space).
    """

    shares_vocabulary = False

    def __init__(self, whisper, whisper_tokenizer, wav2vec2, ctc_vocabulary: list[str], prompt_ids=None,
                 text_prefix: str = " ", name: str = "whisper+wav2vec2"):
        from transformers import WhisperFeatureExtractor

        self.whisper = whisper.eval()
        self.wav2vec2 = wav2vec2.eval()
        self.whisper_tokenizer = whisper_tokenizer
        self.ctc_vocabulary = list(ctc_vocabulary)
        if len(self.ctc_vocabulary) != wav2vec2.config.vocab_size:
            raise ValueError(f"ctc_vocabulary has {len(self.ctc_vocabulary)} entries, the Wav2Vec2 head "
                             f"{wav2vec2.config.vocab_size}")
        self.ctc_blank_id = wav2vec2.config.pad_token_id
        self.eos_token_id = whisper.config.eos_token_id
        self._prompt = list(prompt_ids) if prompt_ids is not None else [whisper.config.decoder_start_token_id]
        self.text_prefix = text_prefix
        self.device = next(whisper.parameters()).device
        self.name = name
        # Whisper's encoder takes a fixed window of 2 × max_source_positions mel frames.
        frames = 2 * whisper.config.max_source_positions
        self.max_input_seconds = frames * 160 / 16000  # what the window holds (30 s for real checkpoints)
        self.features = WhisperFeatureExtractor(feature_size=whisper.config.num_mel_bins,
                                                chunk_length=frames * 160 // 16000)
        self.features.n_samples = frames * 160
        self.features.nb_max_frames = frames

    def encode(self, waves, num_samples):
        arrays = [waves[b, : int(num_samples[b])].cpu().numpy() for b in range(waves.shape[0])]
        if max(len(a) for a in arrays) > self.features.n_samples:
            raise ValueError(f"audio longer than Whisper's window of {self.features.n_samples / 16000:.1f} s; "
                             "split it first")
        feats = self.features(arrays, sampling_rate=16000, return_tensors="pt").input_features
        dtype = next(self.whisper.parameters()).dtype
        states = self.whisper.model.encoder(feats.to(self.device, dtype)).last_hidden_state
        # Wav2Vec2 expects zero-mean, unit-variance audio per utterance, padded with zeros.
        normed = torch.zeros_like(waves)
        for b, a in enumerate(arrays):
            x = torch.from_numpy(a)
            normed[b, : len(a)] = (x - x.mean()) / (x.std(unbiased=False) + 1e-7)
        mask = torch.arange(waves.shape[1], device=waves.device)[None] < num_samples[:, None]
        logits = self.wav2vec2(normed.to(self.device), attention_mask=mask.long().to(self.device)).logits
        lengths = self.wav2vec2._get_feat_extract_output_lengths(num_samples).long().clamp(max=logits.shape[1])
        return EncodedSpeech(logits.float(), lengths.to(self.device), states)

    def decoder(self, encoded, rows=None):
        states = encoded.decoder_context
        if rows is not None:
            states = states.index_select(0, rows.to(states.device))
        return WhisperDecoderAdapter(self.whisper, states)

    def prompt_ids(self):
        return list(self._prompt)

    def ctc_to_text(self, ids):
        pieces = []
        for i in ids:
            token = self.ctc_vocabulary[int(i)]
            if token.startswith("<") and token.endswith(">"):
                continue
            pieces.append(" " if token == "|" else token)
        return " ".join("".join(pieces).split())

    def text_to_decoder_ids(self, text):
        text = text.strip()
        return self.whisper_tokenizer.encode(self.text_prefix + text, add_special_tokens=False) if text else []

    def decoder_ids_to_text(self, ids):
        ids = [int(i) for i in ids]
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return self.whisper_tokenizer.decode(ids, skip_special_tokens=True).strip()

    @torch.no_grad()
    def assisted_generation(self, waves, num_samples, assistant, max_new_tokens: int) -> dict:
        """The peer: `transformers` assisted generation (greedy) with a smaller Whisper as the assistant, one
        utterance at a time (the library's assisted generation takes batch 1). Counts the main decoder's
        forwards."""
        from transformers import GenerationMixin

        calls = {"n": 0}
        hook = self.whisper.model.decoder.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
        sequences, start = [], time.perf_counter()
        try:
            for b in range(waves.shape[0]):
                a = waves[b, : int(num_samples[b])].cpu().numpy()
                feats = self.features([a], sampling_rate=16000, return_tensors="pt").input_features
                prompt = torch.tensor([self._prompt], device=self.device)
                # The library's generic assisted generation (WhisperForConditionalGeneration.generate adds
                # long-form and language logic that needs Hub generation configs).
                out = GenerationMixin.generate(self.whisper, input_features=feats.to(self.device),
                                               decoder_input_ids=prompt, assistant_model=assistant, do_sample=False,
                                               num_beams=1, max_new_tokens=max_new_tokens)
                sequences.append(out[0, len(self._prompt):].tolist())
        finally:
            hook.remove()
        return {"sequences": sequences, "target_nfe": calls["n"], "time_s": time.perf_counter() - start}


# ------------------------------------------------------------------------ tiny random pair (tests, peer bench)
TINY_CHARS = " abcdefghijklmnopqrstuvwxyz'"
TINY_EOT, TINY_SOT, TINY_EN, TINY_TRANSCRIBE, TINY_NO_TIMESTAMPS = 28, 29, 30, 31, 32
TINY_WAV2VEC2_VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|"] + list("abcdefghijklmnopqrstuvwxyz'")


class TinyCharTokenizer:
    """Character-level stand-in for WhisperTokenizer (its files come from the Hub): encode and decode only."""

    def encode(self, text, add_special_tokens=False):
        return [TINY_CHARS.index(c) for c in text.lower() if c in TINY_CHARS]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(TINY_CHARS[i] for i in ids if i < len(TINY_CHARS))


def tiny_random_whisper(seed: int = 0, decoder_layers: int = 2):
    """A random WhisperForConditionalGeneration with a 10 s window and a 40-id character vocabulary."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=40, num_mel_bins=80, encoder_layers=1, encoder_attention_heads=2, decoder_layers=decoder_layers,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=500,
        max_target_positions=128, pad_token_id=TINY_EOT, bos_token_id=TINY_EOT, eos_token_id=TINY_EOT,
        decoder_start_token_id=TINY_SOT, suppress_tokens=None, begin_suppress_tokens=None)).eval()


def tiny_random_recognizer(seed: int = 0, decoder_layers: int = 2) -> HFSpeechRecognizer:
    """Random tiny Whisper verifier + Wav2Vec2ForCTC drafter: the adapter pair, built offline (no Hub)."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    whisper = tiny_random_whisper(seed, decoder_layers)
    torch.manual_seed(seed + 1)
    wav2vec2 = Wav2Vec2ForCTC(Wav2Vec2Config(
        vocab_size=len(TINY_WAV2VEC2_VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, conv_dim=(32, 32, 32, 32), conv_stride=(5, 4, 4, 4), conv_kernel=(10, 8, 8, 8),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, pad_token_id=0, do_stable_layer_norm=True,
        feat_extract_norm="layer"))
    prompt = [TINY_SOT, TINY_EN, TINY_TRANSCRIBE, TINY_NO_TIMESTAMPS]
    return HFSpeechRecognizer(whisper, TinyCharTokenizer(), wav2vec2, TINY_WAV2VEC2_VOCAB, prompt_ids=prompt,
                              name="whisper-tiny-random")


def tiny_random_pipeline(device: str = "cpu"):
    """`mmspec bench ctc_draft --model whisper-tiny-random`: the random adapter pair, with a one-layer random
    Whisper as the assistant of the `transformers` assisted-generation peer. Random weights: the row
    compares mechanics and overheads (NFE, time), not accuracy."""
    from .pipeline import ASRPipeline

    recognizer = tiny_random_recognizer(0)
    recognizer.whisper.to(device)
    recognizer.wav2vec2.to(device)
    recognizer.device = torch.device(device)
    pipe = ASRPipeline(recognizer)
    pipe.peer_assistant = tiny_random_whisper(7, decoder_layers=1).to(device)
    pipe.bench_num_samples = 32
    pipe.call_defaults = {"max_new_tokens": 48, "temperature": 0.0}
    return pipe
