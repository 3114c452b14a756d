"""`ASRPipeline`: audio in, text out, with any decoding plugin (plain AR by default, `ctc_draft`, ...).

    from mmspec import load_plugin
    pipe = load_plugin("ctc_draft", mode="relaxed")          # bundled asr-tiny
    out = pipe(["a.wav", (wave, 22050)], batch_size=8)
    out.texts, out.inverse_rtf

Inputs: a file path, a mono waveform (numpy array or torch tensor) with `sampling_rate`, a
``(waveform, sampling_rate)`` pair, a ``{"array": ..., "sampling_rate": ...}`` dict (the `datasets`
convention), or a list of them. Audio must be finite and non-empty; multi-channel audio (files, and arrays as
[channels, N] or [N, channels] with at most 8 channels: the short side is the channels) is averaged to mono
and other rates are resampled to 16 kHz, each with one warning naming the input. A call checks all its inputs
before any model work and names every bad one in one error.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile
import torch
import torchaudio

from ..common.logits import LogitsPipeline
from ..common.decoder import check_max_batch_size
from ..common.loading import load_saved_plugin
from ..common.pipeline import BatchProgress, Pipeline, SampleStream, load_each
from ..common.plugin import DecodeRequest
from ..common.stats import DecodeStats
from .asr_model import SAMPLE_RATE
from .recognizer import BUNDLED_ASR_DIR, BundledRecognizer, SpeechRecognizer
from .segment import split_utterances
from .structure import AUDIO_SECONDS, GATED_ROWS, CTCTranscript
from .text import normalize_text
from .spec import ASR_SPEC, check_audio_file


MIN_SPEECH_SECONDS = 0.1  # shorter than the shortest word


def inverse_rtf(stats: DecodeStats) -> float:
    """Seconds of audio transcribed per second of compute (0 without audio)."""
    return stats.extra.get(AUDIO_SECONDS, 0.0) / stats.time_total_s if stats.time_total_s > 0 else 0.0


@dataclass
class ASROutput:
    texts: list[str]
    sequences: list[list[int]]  # decoder ids of each transcript (its pieces' ids, in order, when it was split)
    stats: DecodeStats = field(default_factory=DecodeStats)
    segments: list[int] = field(default_factory=list)  # per input: utterances it was split into (0: no sound)
    warnings: list[list[str]] = field(default_factory=list)  # per input: what may make its text incomplete

    @property
    def inverse_rtf(self) -> float:
        return inverse_rtf(self.stats)


MAX_CHANNELS = 8  # 7.1 surround; a 2-D array with more on both sides has no side that is plainly its channels


def audio_seconds(item) -> float:
    """Duration of a file, a ``{"array", "sampling_rate"}`` dict or a ``(waveform, rate)`` pair."""
    if isinstance(item, (str, os.PathLike)):
        return soundfile.info(str(item)).duration
    array, rate = (item["array"], item["sampling_rate"]) if isinstance(item, dict) else item
    shape = tuple(np.shape(array))
    return (max(shape) if len(shape) == 2 else len(array)) / rate  # [channels, N] or [N, channels]: N


def to_mono(wave: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
    """A waveform [N], [1, N] / [N, 1], or [C, N] / [N, C] with C <= MAX_CHANNELS (the short side is the channels:
    torchaudio's layout and soundfile's both work) -> (the channels' mean [N], C). Averaging is what librosa and
    torchaudio users do to feed a mono model; a model trained on one channel has no use for the others."""
    if wave.dim() == 2 and 1 in wave.shape:
        return wave.reshape(-1), 1
    if wave.dim() == 2 and min(wave.shape) <= MAX_CHANNELS < max(wave.shape):
        axis = int(wave.shape[1] < wave.shape[0])
        return wave.float().mean(dim=axis), wave.shape[axis]
    if wave.dim() != 1:
        raise ValueError(f"{name}: waveform must be [samples], or [channels, samples] / [samples, channels] with at "
                         f"most {MAX_CHANNELS} channels; got shape {tuple(wave.shape)}")
    return wave, 1


def load_audio(item, sampling_rate: int | None = None, name: str = "audio", notice: bool = True) -> torch.Tensor:
    """One input (see module docstring) -> float32 mono waveform [N] at 16 kHz; clear errors otherwise.

    Multi-channel audio is averaged to mono and other rates are resampled, as audio libraries do; either is
    told in one warning naming the input (notice=False: silently, for callers that convert on purpose)."""
    label = name
    if isinstance(item, (str, os.PathLike)):
        label = f"{name} {str(item)!r}"
        if not os.path.exists(item):
            raise FileNotFoundError(f"{name}: no such audio file {str(item)!r}")
        try:
            data, rate = soundfile.read(str(item), dtype="float32", always_2d=True)
        except soundfile.LibsndfileError:
            raise ValueError(f"{name}: {str(item)!r} is not an audio file soundfile can read (wav, flac, ogg, "
                             "mp3)") from None
        channels = data.shape[1]
        wave = torch.from_numpy(data.mean(axis=1) if channels > 1 else data[:, 0].copy())
    else:
        if isinstance(item, dict):
            if "array" not in item or "sampling_rate" not in item:
                raise ValueError(f"{name}: a dict input needs the keys 'array' and 'sampling_rate', got {sorted(item)}")
            item, rate = item["array"], item["sampling_rate"]
        elif isinstance(item, tuple):
            if len(item) != 2:
                raise ValueError(f"{name}: a tuple input must be (waveform, sampling_rate), got {len(item)} items")
            item, rate = item
        else:
            rate = sampling_rate
        if rate is None:
            raise ValueError(f"{name}: a waveform needs sampling_rate (an int, e.g. 16000)")
        check_sampling_rate(rate)
        if isinstance(item, np.ndarray):
            wave = torch.from_numpy(np.ascontiguousarray(item))
        elif isinstance(item, torch.Tensor):
            wave = item.detach().cpu()
        else:
            raise TypeError(f"{name}: expected a file path, a numpy array, a torch tensor, a (waveform, "
                            f"sampling_rate) tuple or a dict, got {type(item).__name__}")
        if not (wave.is_floating_point() or wave.dtype in (torch.int16, torch.int32)):
            raise TypeError(f"{name}: waveform dtype must be float or int16/int32 PCM, got {wave.dtype}")
        if wave.dtype == torch.int16:
            wave = wave.float() / 32768.0
        elif wave.dtype == torch.int32:
            wave = wave.float() / 2147483648.0
        if wave.numel() == 0:
            raise ValueError(f"{name}: audio is empty")
        wave, channels = to_mono(wave, name)
        wave = wave.float()
    if wave.numel() == 0:
        raise ValueError(f"{name}: audio is empty")
    if not bool(torch.isfinite(wave).all()):
        raise ValueError(f"{name}: audio contains NaN or infinite samples")
    notes = [f"{channels} channels downmixed to mono"] if channels > 1 else []
    if rate != SAMPLE_RATE:
        wave = torchaudio.functional.resample(wave, int(rate), SAMPLE_RATE)
        notes.append(f"{rate} Hz resampled to {SAMPLE_RATE} Hz")
    if notes and notice:
        warnings.warn(f"{label}: {'; '.join(notes)}", stacklevel=2)
    if wave.numel() < 400:  # one 25 ms analysis window
        raise ValueError(f"{name}: audio is too short ({wave.numel()} samples at 16 kHz; need at least 400)")
    return wave


def check_sampling_rate(rate) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise TypeError(f"sampling_rate must be a positive int (samples per second), got {rate!r} "
                        f"({type(rate).__name__})")


def join_utterances(texts: list[str]) -> str:
    """One input's transcript from its utterances' texts, in order (empty ones, silence, dropped)."""
    return " ".join(t.strip() for t in texts if t.strip())


def as_batch(audio) -> list:
    """The list of single inputs in `audio` (a single input becomes a list of one)."""
    if isinstance(audio, list):
        if not audio:
            raise ValueError("audio is an empty list")
        return audio
    return [audio]


def pad_waves(waves: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([w.numel() for w in waves])
    return torch.nn.utils.rnn.pad_sequence(waves, batch_first=True), lengths


class ASRPipeline(Pipeline):
    """Speech recognition over a `SpeechRecognizer` with a decoding plugin; diffusers-style conventions."""

    modality = "speech"
    pipeline_name = "asr"
    bench_num_samples = 200
    spec = ASR_SPEC
    call_defaults = ASR_SPEC.call_defaults
    # Which committed set `mmspec bench` transcribes: see `speech.data.BENCH_TEST_SETS`.
    bench_settings = ASR_SPEC.bench_defaults
    bench_input_settings = ("test_set",)
    peer_assistant = None  # a small Whisper for the `transformers` assisted-generation bench peer

    def __init__(self, recognizer: SpeechRecognizer, plugin=None):
        self.recognizer = recognizer
        self.plugin = plugin
        self.device = recognizer.device
        self.model_name = recognizer.name
        self._progress = {}

    @property
    def token_structure(self) -> CTCTranscript:
        return CTCTranscript()

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike = BUNDLED_ASR_DIR, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "ASRPipeline":
        """A pipeline over the bundled model format (`ASRModel` + `CharTokenizer` in one folder), with the
        plugin saved beside it, if any."""
        return cls(BundledRecognizer.from_pretrained(directory, device=device, dtype=dtype),
                   plugin=load_saved_plugin(directory))

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        if not isinstance(self.recognizer, BundledRecognizer):
            raise NotImplementedError(f"{type(self.recognizer).__name__} cannot be saved by ASRPipeline; save "
                                      "its models with their own save_pretrained")
        os.makedirs(directory, exist_ok=True)
        self.recognizer.save_pretrained(directory)
        self.save_plugin(directory)

    def set_progress_bar_config(self, **kwargs) -> None:
        self._progress = dict(kwargs)

    @torch.no_grad()
    def __call__(self, audio, sampling_rate: int | None = None, *, batch_size: int = 8, max_new_tokens: int = 200,
                 temperature: float = 0.0, generator=None, return_dict: bool = True,
                 segment: bool = True, max_batch_size: int | None = None, on_sample_done=None) -> ASROutput:
        """Transcribe `audio` (one input or a list; see the module docstring). segment: split long recordings
        into utterances at pauses and at the model's length limit (`mmspec.speech.segment`), transcribe them
        as rows of the batch and join their texts; False feeds each input whole.

        batch_size: utterances encoded, and decoded, together. max_batch_size: continuous batching — the
        encoder still runs `batch_size` utterances at a time, but the decoder takes all of the call's
        utterances, at most max_batch_size at once, and starts the next waiting one as soon as one finishes
        (a batch no longer waits for its longest transcript). Each transcript is the same either way; the
        encoder outputs of the whole call are kept meanwhile (about as much memory as its audio).
        on_sample_done(index, text, statistics): called as each input's transcript is ready (all its utterances
        decoded), before the call returns (`SampleStream`)."""
        items = as_batch(audio)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        check_max_batch_size(max_batch_size)
        logits = LogitsPipeline(temperature=temperature)  # bad settings fail before any audio is read
        if max_batch_size is not None:
            blocker = self.continuous_batching_blocker()
            if blocker is not None:
                raise ValueError(f"max_batch_size needs continuous batching, but {blocker}; leave it None and set "
                                 "batch_size")
        if sampling_rate is not None:
            check_sampling_rate(sampling_rate)  # once for the call, not once per input that uses it
        waves = load_each(items, lambda x, name: load_audio(x, sampling_rate, name=name), "audio")
        generators = generator if isinstance(generator, list) else [generator] * len(waves)
        if len(generators) != len(waves):
            raise ValueError(f"got {len(generators)} generators for {len(waves)} inputs")
        pieces, owners, piece_generators, notes = self._utterances(waves, generators, segment)
        decoder_text = self.recognizer.decoder_ids_to_text
        stream = None if on_sample_done is None else SampleStream(
            on_sample_done, lambda i, rows: join_utterances([decoder_text(r) for r in rows]), len(waves), owners)
        if max_batch_size is not None:
            texts, sequences, stats = self._transcribe(pieces, logits, max_new_tokens, piece_generators, batch_size,
                                                       max_batch_size, stream=stream)
        else:
            texts, sequences, stats = [], [], DecodeStats()
            starts = range(0, len(pieces), batch_size)
            with BatchProgress("transcribing", len(starts), len(pieces), "utterance", config=self._progress,
                               disable=len(starts) < 2, per_batch=True) as progress:
                for start in starts:
                    chunk = pieces[start:start + batch_size]
                    t, s, st = self._transcribe(chunk, logits, max_new_tokens,
                                                piece_generators[start:start + batch_size], len(chunk),
                                                stream=stream, offset=start)
                    texts += t
                    sequences += s
                    stats = stats.merge(st)
                    progress.update(len(chunk))
        if stream is not None:
            stream.close(sequences, stats)
        output = self._join_pieces(len(waves), owners, texts, sequences, stats, notes, max_new_tokens)
        return output if return_dict else (output.texts,)

    def _utterances(self, waves, generators, segment: bool):
        """Each input's utterances (`mmspec.speech.segment`), their owner, generator, and per-input notes."""
        rec = self.recognizer
        pieces, owners, piece_generators, notes = [], [], [], [[] for _ in waves]
        for i, (wave, gen) in enumerate(zip(waves, generators)):
            seconds = wave.numel() / SAMPLE_RATE
            if seconds < MIN_SPEECH_SECONDS:
                notes[i].append(f"audio is {seconds * 1000:.0f} ms long: too short to hold a word")
            ranges = (split_utterances(wave, SAMPLE_RATE, rec.max_input_seconds, rec.pause_seconds) if segment
                      else [(0, wave.numel())])
            if not ranges:
                notes[i].append("no speech found: the audio is silent or holds only steady noise")
            for j, (a, b) in enumerate(ranges):
                pieces.append(wave[a:b])
                owners.append(i)
                # An input split in several pieces gives each its own generator drawn from the input's, so
                # its text does not depend on which pieces share a batch.
                piece_generators.append(gen if len(ranges) == 1 or gen is None else
                                        torch.Generator().manual_seed(int(torch.randint(2 ** 62, (1,), generator=gen))))
        return pieces, owners, piece_generators, notes

    def _join_pieces(self, num_inputs, owners, texts, sequences, stats, notes, max_new_tokens) -> ASROutput:
        texts_of = [[] for _ in range(num_inputs)]
        ids = [[] for _ in range(num_inputs)]
        cut = [False] * num_inputs
        eos = self.recognizer.eos_token_id
        for owner, text, seq in zip(owners, texts, sequences):
            texts_of[owner].append(text)
            ids[owner] += seq
            cut[owner] |= len(seq) >= max_new_tokens and (not seq or seq[-1] != eos)
        for i in range(num_inputs):
            if cut[i]:
                notes[i].append(f"reached max_new_tokens={max_new_tokens} before the end of an utterance: its text "
                                "is cut (raise max_new_tokens)")
        segments = [0] * num_inputs
        for owner in owners:
            segments[owner] += 1
        if segments != [1] * num_inputs:  # decode rows were utterances, not inputs
            stats.forget_rows()
            stats.num_rows = num_inputs
        flagged = [i for i, n in enumerate(notes) if n]
        if flagged:
            warnings.warn("; ".join(f"audio[{i}]: {', '.join(notes[i])}" for i in flagged[:3])
                          + (f" (and {len(flagged) - 3} more)" if len(flagged) > 3 else ""), stacklevel=3)
        return ASROutput(texts=[join_utterances(parts) for parts in texts_of], sequences=ids, stats=stats,
                         segments=segments, warnings=notes)

    def _transcribe(self, waves, logits, max_new_tokens, generators, encode_batch, max_batch_size=None,
                    stream: SampleStream | None = None, offset: int = 0):
        """Utterances `waves`: encoded `encode_batch` at a time, then decoded as one call (with max_batch_size:
        at most that many at once, admitting the next as one finishes). Texts, decoder ids, statistics.
        stream: told of each utterance as it finishes (the call's utterances from `offset`)."""
        if not waves:  # every input was silent: nothing to encode or decode
            return [], [], DecodeStats()
        begin = time.perf_counter()
        parts, audio = [], 0.0
        for start in range(0, len(waves), encode_batch):
            padded, num_samples = pad_waves(waves[start:start + encode_batch])
            parts.append(self.recognizer.encode(padded.to(self.device), num_samples.to(self.device)))
            audio += float(num_samples.sum()) / SAMPLE_RATE
        encoded = parts[0] if len(parts) == 1 else self.recognizer.join_encoded(parts)
        encode_time = time.perf_counter() - begin
        batch_gen = None if all(g is None for g in generators) else generators
        out = self.decode(encoded, logits, max_new_tokens, batch_gen, max_batch_size=max_batch_size,
                          callback=None if stream is None else stream.step_callback(offset))
        stats = out.stats
        stats.time_encode_s += encode_time
        stats.time_total_s = time.perf_counter() - begin
        stats.add(AUDIO_SECONDS, audio)
        sequences = out.tolist()
        return [self.recognizer.decoder_ids_to_text(s) for s in sequences], sequences, stats

    def decode(self, encoded, logits: LogitsPipeline, max_new_tokens: int, generator,
               max_batch_size: int | None = None, callback=None):
        """The attached plugin's decoder over the encoded batch (the pipeline's decode hook).

        The request's `conditioning` is the `EncodedSpeech`, so a speech plugin can read the CTC head's
        output of the same encoder pass (`ctc_draft`)."""
        request = self._request(encoded, logits)
        batch = encoded.ctc_lengths.shape[0]
        prompt = torch.tensor([self.recognizer.prompt_ids()] * batch, device=self.device)
        # max_batch_size only after continuous_batching_blocker() said yes (`__call__`): run_decoder's fallback,
        # rows in chunks, would hand a plugin a slice of the prompts with the whole batch's encoder output.
        return self.run_decoder(request, prompt, max_new_tokens=max_new_tokens, generator=generator,
                                max_batch_size=max_batch_size, callback=callback)

    def _request(self, encoded, logits: LogitsPipeline) -> DecodeRequest:
        eos = self.recognizer.eos_token_id
        return DecodeRequest(self.recognizer.decoder(encoded), logits, self.token_structure, eos_token_id=eos,
                             pad_token_id=eos, conditioning=encoded)

    def continuous_batching_blocker(self) -> str | None:
        from mmspec.common.pipeline import refill_blocker

        blocker = self.recognizer.continuous_batching_blocker()
        if blocker is not None:
            return blocker
        silence = torch.zeros(1, SAMPLE_RATE // 2, device=self.device)  # a decoder to ask needs an encoded batch
        encoded = self.recognizer.encode(silence, torch.tensor([silence.shape[1]], device=self.device))
        return refill_blocker(self.build_decoder(self._request(encoded, LogitsPipeline())))

    # --- batch protocol (see mmspec.common.batch) ------------------------
    batch_fields = {"audio": "path of an audio file soundfile reads (wav, flac, ogg; stereo is averaged to mono)"}
    batch_suffix = ".txt"

    def batch_input(self, record: dict, base_dir):
        from mmspec.common.batch import path_field

        path = path_field(record, "audio", base_dir, self.batch_fields["audio"])
        try:
            check_audio_file(path)  # a header check: reading every file's samples here would double the I/O
        except ValueError as exc:
            raise ValueError(f"field 'audio': {path!r} is {exc}") from None
        return path  # several channels or another rate are converted when it is read (`load_audio`)

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        width = call.get("max_batch_size") or len(inputs)  # continuous batching: encode as many as decode at once
        shown, self._progress = self._progress, {**self._progress, "disable": True}  # the runner shows its own
        try:
            return self(inputs, batch_size=width, generator=generators, on_sample_done=on_sample_done, **call).stats
        finally:
            self._progress = shown

    def batch_write(self, output, path) -> None:
        Path(path).write_text(output + "\n")

    def cli_inputs(self, args):
        from .data import load_test_set

        if args.audio:
            return [{"audio": path} for path in args.audio], False
        return self.cli_held_out(load_test_set(), args.num, "clips", "--audio"), True

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --audio a.wav ...`: print transcripts (held-out clips without --audio); `--out`
        a .txt file: the transcripts, one a line; a .json file: each with its audio path, and the statistics."""
        import json

        paths = [row["audio"] for row in self.cli_inputs(args)[0]]
        out = self(paths, batch_size=args.batch_size, **call)
        for path, text in zip(paths, out.texts):
            print(f"{path}: {text}")
        print(f"{out.stats}  inverse RTF {out.inverse_rtf:.1f}")
        if args.out and Path(args.out).suffix.lower() == ".txt":  # one transcript a line, as `mmspec batch` writes
            Path(args.out).write_text("".join(text + "\n" for text in out.texts))
        elif args.out:
            records = [{"audio": str(p), "text": t} for p, t in zip(paths, out.texts)]
            Path(args.out).write_text(json.dumps({"transcripts": records, "stats": out.stats.to_dict()}, indent=2))
        return 0

    # --- bench protocol (see mmspec.common.bench) ------------------------
    def bench_inputs(self, num_samples: int, seed: int, test_set: str = "in_domain") -> list[dict]:
        from .data import bench_test_set

        rows = bench_test_set(test_set)
        if num_samples > len(rows):
            raise ValueError(f"num_samples must be at most {len(rows)} (the {test_set} set), got {num_samples}")
        return rows[:num_samples]

    def bench_generate(self, inputs: list[dict], batch_size: int, seed: int, settings: dict):
        settings = {k: v for k, v in settings.items() if k not in self.bench_settings}
        if settings.get("max_batch_size") is not None:  # continuous batching: the encoder batch stays as wide as
            batch_size = min(batch_size, settings["max_batch_size"])  # the decoder's (the refill bench's is all)
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(inputs))]
        out = self([row["audio"] for row in inputs], batch_size=batch_size, generator=gens, **settings)
        return out.sequences, out.stats

    def bench_quality(self, inputs: list[dict], sequences: list[list[int]]) -> dict:
        from mmspec.common.stats import PER_SAMPLE

        from .metrics import error_counts, rates_of

        texts = [self.recognizer.decoder_ids_to_text(s) for s in sequences]
        if any(not row["text"] for row in inputs):  # noise: no words to get right, only words made up
            words = [len(normalize_text(t).split()) for t in texts]
            return {"words_per_clip": sum(words) / len(words),
                    PER_SAMPLE: {"words_per_clip": (words, [1] * len(words))}}
        counts = error_counts([row["text"] for row in inputs], texts)
        return {**rates_of(counts), PER_SAMPLE: counts}

    def bench_summary(self, inputs: list[dict], stats: DecodeStats, seconds: float) -> dict:
        """Real-time factor over the same audio (durations), and the share of decoded utterances a gate
        finished (an input split into several utterances counts each)."""
        audio = sum(audio_seconds(row["audio"]) for row in inputs)
        return {"inverse_rtf": audio / max(seconds, 1e-9),
                "gated_fraction": stats.extra.get(GATED_ROWS, 0) / max(1, stats.num_rows)}

    @classmethod
    def bench_sections(cls, results: list[dict]) -> list[tuple[str, str, str]]:
        from .bench import speech_table

        table = speech_table(results)
        if not table:
            return []
        return [("Speech: word error and real-time factors",
                 "Inverse RTF = seconds of audio per second of wall-clock (encoder included). Ceiling = AR time / "
                 "CTC-only time at the same batch size: the most any CTC-drafted method could gain. Gated = "
                 "utterances the entropy gate finished without the decoder. Test sets (`--set test_set=`): "
                 "in_domain = held-out fortunes sentences in the training voices; out_of_domain = README "
                 "sentences of installed packages (a text source training never saw) in espeak-ng accents and "
                 "variants training never used; foreign = German dates in German voices; noise = clips with no "
                 "speech (its error column counts made-up words per clip).", table)]


def bundled_pipeline(device: str = "cpu") -> ASRPipeline:
    if not (BUNDLED_ASR_DIR / "config.json").exists():
        raise FileNotFoundError(f"the bundled ASR model is missing from {BUNDLED_ASR_DIR}")
    return ASRPipeline.from_pretrained(BUNDLED_ASR_DIR, device=device)
