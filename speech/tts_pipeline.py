"""`TTSPipeline`: text in, speech out, over a two-level codec TTS model and an audio codec.

    from mmspec import load_plugin
    pipe = load_plugin("ar", model="tts-tiny")
    out = pipe(["a fool and his money are soon parted"], generator=torch.Generator().manual_seed(0))
    out.audios[0], out.sampling_rate, out.codes[0], out.stats

Per frame, the backbone samples codebook 0 (settings `temperature` / `top_k` / `top_p`), then the attached
plugin's decoder runs the depth decoder (an `ARModel`, `DepthDecoderAR`) over the batch for codebooks
1 … K−1 (settings `depth_temperature` / `depth_top_k` / `depth_top_p`); the frame's embedding goes back into
the backbone. The defaults are those deployed systems sample with: Qwen3-TTS samples its code predictor at
temperature 0.9, top-k 50, top-p 1.0, and the talker alike. The codec turns the codes into audio.

Statistics: the `DecodeStats` of a call are those of the depth decoder summed over frames, one row per text
(so `nfe_per_sample` is the depth-decoder calls one text needed: K−1 per frame under plain AR), plus the
counters in `mmspec.speech.structure` (frames, backbone forwards, the time split between backbone, depth
decoder and codec, seconds of audio produced); the bench reports depth-decoder calls per frame.

Randomness: with one generator per text (a list), text i's audio depends on generator i only, so a batch
gives the same audio as the texts one by one.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..common.kernels.sampling import sample_inverse_cdf
from ..common.logits import LogitsPipeline, check_generators, draw_uniform
from ..common.model import map_dynamic_cache
from ..common.loading import load_saved_plugin
from ..common.pipeline import BatchProgress, Pipeline, hand_on_all
from ..common.plugin import DecodeRequest
from ..common.stats import DecodeStats
from ..common.structure import RVQFrames
from .structure import (AUDIO_OUT_SECONDS, BACKBONE_NFE, FRAMES, TIME_BACKBONE, TIME_CODEC, TIME_DEPTH,
                        UNFINISHED_ROWS)
from .text import CharTokenizer, normalize_text
from .tts_model import DepthDecoderAR, backbone_forward, end_of_speech_id, frame_embeddings, text_embeddings
from .spec import TTS_SPEC

BUNDLED_TTS_DIR = Path(__file__).parent / "bundled" / "tts_tiny"
OUTPUT_TYPES = ("np", "pt")


@dataclass
class TTSOutput:
    audios: list  # one waveform per text: float32 numpy arrays (output_type "np") or torch tensors ("pt")
    sampling_rate: int
    codes: list[torch.Tensor]  # [K, T] long per text
    finished: list[bool]  # False where a text hit max_new_frames before end of speech
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def real_time_factor(self) -> float:
        """Compute seconds per second of audio produced (< 1: faster than real time)."""
        audio = self.stats.extra.get(AUDIO_OUT_SECONDS, 0.0)
        return self.stats.time_total_s / audio if audio > 0 else float("inf")


class CharacterFrontend:
    """Text -> ids for the bundled model: ``<s>`` + lower-case letters, apostrophes and spaces + ``</s>``.

    Punctuation is read as a word break (it carries no sound in the training data); a letter or digit the
    alphabet lacks is an error rather than being dropped in silence."""

    def __init__(self, tokenizer: CharTokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text: str, name: str) -> list[int]:
        unknown = sorted({c for c in text.lower() if c.isalnum() and c not in self.tokenizer.characters})
        if unknown:
            raise ValueError(f"{name} contains characters this voice cannot read: {', '.join(map(repr, unknown))} "
                             f"(it reads the letters a-z and apostrophes; spell numbers out)")
        ids = self.tokenizer.encode(text)
        if not any(c.isalpha() for c in normalize_text(text)):
            raise ValueError(f"{name} has no speakable characters (letters a-z): {text!r}")
        return [self.tokenizer.bos_id] + ids + [self.tokenizer.eos_id]


class HFTokenizerFrontend:
    """Text -> ids for a real CSM checkpoint with its `transformers` tokenizer: CSM's ``[speaker]text`` prompt
    with the tokenizer's special tokens."""

    def __init__(self, tokenizer, speaker: int = 0):
        self.tokenizer, self.speaker = tokenizer, speaker

    def __call__(self, text: str, name: str) -> list[int]:
        if not any(c.isalnum() for c in text):
            raise ValueError(f"{name} has no speakable characters: {text!r}")
        return list(self.tokenizer(f"[{self.speaker}]{text}", add_special_tokens=True)["input_ids"])


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class TTSPipeline(Pipeline):
    """Text-to-speech over a CSM-shaped model (`transformers` `CsmForConditionalGeneration`) and a codec."""

    modality = "speech"
    pipeline_name = "tts"
    bench_num_samples = 16
    spec = TTS_SPEC
    call_defaults = TTS_SPEC.call_defaults

    def __init__(self, model, tokenizer, codec, plugin=None, frontend=None):
        config = model.config
        if config.num_codebooks != codec.num_codebooks:
            raise ValueError(f"the codec has {codec.num_codebooks} codebooks but the TTS model predicts "
                             f"{config.num_codebooks}: they must match")
        if codec.codebook_size > config.vocab_size:
            raise ValueError(f"the codec's codebook size ({codec.codebook_size}) exceeds the TTS model's code "
                             f"vocabulary ({config.vocab_size})")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.codec = codec
        self.plugin = plugin
        self.frontend = frontend or (CharacterFrontend(tokenizer) if isinstance(tokenizer, CharTokenizer)
                                     else HFTokenizerFrontend(tokenizer))
        self.device = next(model.parameters()).device
        self.sampling_rate = codec.sampling_rate
        self._progress = {}

    @property
    def token_structure(self) -> RVQFrames:
        return RVQFrames(depth=self.codec.num_codebooks, codebook_size=self.codec.codebook_size,
                         state_size=self.model.depth_decoder.config.hidden_size)

    # --- persistence ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike = BUNDLED_TTS_DIR, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "TTSPipeline":
        """The bundled format: ``model/`` (CSM), ``tokenizer.json``, ``codec/`` and the plugin, if any."""
        from transformers import CsmForConditionalGeneration

        from .codec import SpectralRVQCodec

        directory = Path(directory)
        for part in ("model", "codec", "tokenizer.json"):
            if not (directory / part).exists():
                raise FileNotFoundError(f"{directory} is not a TTSPipeline folder: {part} is missing")
        model = CsmForConditionalGeneration.from_pretrained(directory / "model", dtype=dtype).to(device)
        codec = SpectralRVQCodec.from_pretrained(directory / "codec", torch_dtype=torch.float32).to(device).eval()
        return cls(model, CharTokenizer.from_pretrained(str(directory)), codec,
                   plugin=load_saved_plugin(directory))

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        from .codec import SpectralRVQCodec

        if not isinstance(self.codec, SpectralRVQCodec) or not isinstance(self.tokenizer, CharTokenizer):
            raise NotImplementedError("TTSPipeline.save_pretrained writes the bundled format (SpectralRVQCodec + "
                                      "CharTokenizer); save a Hugging Face model and codec with their own "
                                      "save_pretrained")
        save_tts_bundle(directory, self.model, self.tokenizer, self.codec)
        self.save_plugin(directory)

    def set_progress_bar_config(self, **kwargs) -> None:
        self._progress = dict(kwargs)

    # --- generation ------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, text, *, generator=None, max_new_frames: int = 250, temperature: float = 0.9,
                 top_k: int | None = 50, top_p: float | None = 1.0, depth_temperature: float = 0.9,
                 depth_top_k: int | None = 50, depth_top_p: float | None = 1.0, batch_size: int = 8,
                 output_type: str = "np", return_dict: bool = True) -> TTSOutput:
        """Speak `text` (a string or a list of strings); see the module docstring for the settings."""
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a non-empty string or a non-empty list of strings, got "
                             f"{text!r:.80}")
        for i, t in enumerate(texts):
            if not t.strip():
                raise ValueError(f"text[{i}] is empty" if len(texts) > 1 else "text is empty")
        _check_int("max_new_frames", max_new_frames, 1)
        _check_int("batch_size", batch_size, 1)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {', '.join(OUTPUT_TYPES)}, got {output_type!r}")
        backbone_logits = LogitsPipeline(temperature, top_k, top_p)
        depth_logits = LogitsPipeline(depth_temperature, depth_top_k, depth_top_p)
        check_generators(generator, len(texts))
        prompts = [self.frontend(t, f"text[{i}]" if len(texts) > 1 else "text") for i, t in enumerate(texts)]

        audios, codes, finished, stats = [], [], [], DecodeStats()
        starts = range(0, len(texts), batch_size)
        bar = BatchProgress("speaking", len(starts), len(texts), "text", config={"unit": "it", **self._progress},
                            disable=len(starts) < 2)  # the bar's unit stays tqdm's default; lines say texts
        for start in starts:
            batch_gen = generator[start:start + batch_size] if isinstance(generator, list) else generator
            chunk_codes, chunk_finished, chunk_stats = self.generate_codes(
                prompts[start:start + batch_size], backbone_logits, depth_logits, max_new_frames, batch_gen)
            chunk_audio, codec_stats = self.decode_audio(chunk_codes)
            audios += chunk_audio
            codes += chunk_codes
            finished += chunk_finished
            stats = stats.merge(chunk_stats).merge(codec_stats)
            bar.update(len(chunk_codes))
        bar.close()
        for i, done in enumerate(finished):
            if not done:
                warnings.warn(f"text[{i}] reached max_new_frames={max_new_frames} before end of speech; its audio "
                              "is cut there (raise max_new_frames)", stacklevel=2)
        if output_type == "np":
            audios = [a.numpy() for a in audios]
        out = TTSOutput(audios=audios, sampling_rate=self.sampling_rate, codes=codes, finished=finished,
                        stats=stats)
        return out if return_dict else (audios,)

    def generate_codes(self, prompts: list[list[int]], backbone_logits: LogitsPipeline,
                       depth_logits: LogitsPipeline, max_new_frames: int, generator=None):
        """Codes [K, T_i] per prompt, whether each ended with end of speech, and the decode statistics."""
        model, device = self.model, self.device
        begin = time.perf_counter()
        batch = len(prompts)
        depth = self.codec.num_codebooks
        eos = end_of_speech_id(model)
        eos_is_extra = eos >= self.codec.codebook_size  # bundled: a codebook-0 id of its own; CSM: an all-eos frame
        width = max(map(len, prompts))
        ids = torch.zeros(batch, width, dtype=torch.long, device=device)
        mask = torch.zeros(batch, width, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):  # left padding: every row's next position is the same column
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        stats = DecodeStats()
        tick = time.perf_counter()
        hidden = backbone_forward(model, text_embeddings(model, ids), mask, positions, cache).last_hidden_state
        stats.add(BACKBONE_NFE, 1)
        stats.add(TIME_BACKBONE, time.perf_counter() - tick)
        last_hidden, next_position = hidden[:, -1], positions[:, -1] + 1
        frames = [[] for _ in range(batch)]
        done = [False] * batch
        rows = torch.arange(batch, device=device)  # original index of each active row
        gen, structure = generator, self.token_structure
        for _ in range(max_new_frames):
            tick = time.perf_counter()
            probs = backbone_logits.probs(model.lm_head(last_hidden).float())
            cb0 = sample_inverse_cdf(probs, draw_uniform(gen, rows.numel(), 1, device)[:, 0])
            stats.add(TIME_BACKBONE, time.perf_counter() - tick)
            # Bundled model: end of speech is a codebook-0 id of its own. CSM: a frame of eos codes, judged
            # once the depth decoder has filled it.
            ended = (cb0 == eos) if eos_is_extra else torch.zeros_like(cb0, dtype=torch.bool)
            going = (~ended).nonzero().flatten()
            if going.numel():
                tick = time.perf_counter()
                hidden_going = last_hidden[going]
                request = DecodeRequest(DepthDecoderAR(model.depth_decoder, hidden_going, self.codec.codebook_size),
                                        depth_logits, structure, eos_token_id=None, pad_token_id=0,
                                        conditioning=hidden_going)
                depth_prompt = torch.stack([torch.zeros_like(cb0[going]), cb0[going]], 1)  # [backbone state, cb0]
                depth_gen = [gen[i] for i in going.tolist()] if isinstance(gen, list) else gen
                out = self.run_decoder(request, depth_prompt, max_new_tokens=depth - 1, generator=depth_gen)
                frame = torch.cat([cb0[going, None], out.sequences], 1)  # [G, K]
                stats = stats.merge(out.stats)
                stats.add(TIME_DEPTH, time.perf_counter() - tick)
                stats.add(FRAMES, int(going.numel()))
                if not eos_is_extra:
                    ended[going] = (frame == eos).all(1)
                frame = frame[~ended[going]]
            for i in ended.nonzero().flatten().tolist():
                done[int(rows[i])] = True
            alive = (~ended).nonzero().flatten()
            for j, i in enumerate(alive.tolist()):
                frames[int(rows[i])].append(frame[j])
            if not alive.numel():
                break
            tick = time.perf_counter()
            if alive.numel() != rows.numel():
                rows, mask, next_position = rows[alive], mask[alive], next_position[alive]
                map_dynamic_cache(cache, lambda t: t.index_select(0, alive))
                if isinstance(gen, list):
                    gen = [gen[i] for i in alive.tolist()]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            step = backbone_forward(model, frame_embeddings(model, frame[:, None, :]), mask, next_position[:, None],
                                    cache)
            last_hidden, next_position = step.last_hidden_state[:, -1], next_position + 1
            stats.add(BACKBONE_NFE, 1)
            stats.add(TIME_BACKBONE, time.perf_counter() - tick)
        codes = [torch.stack(f, 1) if f else torch.zeros(depth, 0, dtype=torch.long, device=device) for f in frames]
        stats.num_rows = batch  # rows are texts; the depth decoder's rows were frames
        stats.forget_rows()
        stats.time_total_s = time.perf_counter() - begin
        stats.add(UNFINISHED_ROWS, sum(not d for d in done))
        return codes, done, stats

    def decode_audio(self, codes: list[torch.Tensor]) -> tuple[list[torch.Tensor], DecodeStats]:
        """Waveforms (float32 CPU tensors) of per-text codes [K, T_i] through the codec, batched."""
        stats = DecodeStats()
        begin = time.perf_counter()
        lengths = torch.tensor([c.shape[1] for c in codes])
        audios = [torch.zeros(0) for _ in codes]
        nonempty = [i for i, n in enumerate(lengths.tolist()) if n > 0]
        if nonempty:
            padded = torch.nn.utils.rnn.pad_sequence([codes[i].T for i in nonempty], batch_first=True)
            waves, samples = self.codec.decode(padded.transpose(1, 2), lengths[nonempty])
            for j, i in enumerate(nonempty):
                audios[i] = waves[j, : int(samples[j])].float().cpu()
        seconds = time.perf_counter() - begin
        stats.add(TIME_CODEC, seconds)
        stats.time_total_s = seconds
        stats.add(AUDIO_OUT_SECONDS, sum(a.numel() for a in audios) / self.sampling_rate)
        return audios, stats

    # --- command line (mmspec generate) -----------------------------------------------------------
    # --- batch protocol (see mmspec.common.batch) ------------------------
    batch_fields = {"text": "text to speak"}
    batch_suffix = ".wav"

    def batch_input(self, record: dict, base_dir):
        from mmspec.common.batch import text_field

        text = text_field(record, "text", self.batch_fields["text"])
        self.frontend(text, "field 'text'")  # characters the voice cannot read fail here, before decoding
        return text

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        out = self(inputs, generator=generators, batch_size=len(inputs), output_type="np", **call)
        return hand_on_all(out.audios, out.stats, on_sample_done)

    def batch_write(self, output, path) -> None:
        import soundfile

        soundfile.write(str(path), output, self.sampling_rate, subtype="PCM_16", format="WAV")

    def cli_inputs(self, args):
        from .tts_data import load_tts_test_set

        if args.text:
            return [{"text": text} for text in args.text], False
        return self.cli_held_out(load_tts_test_set(), args.num, "sentences", "--text"), True

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --model tts-tiny --text "..." --out a.wav`: write the speech as WAV (several
        texts: a_0.wav, a_1.wav, ...)."""
        import soundfile

        texts = [row["text"] for row in self.cli_inputs(args)[0]]
        generators = [torch.Generator().manual_seed(args.seed + i) for i in range(len(texts))]
        out = self(texts, generator=generators, batch_size=args.batch_size, **call)
        target = Path(args.out or "speech.wav")
        if target.suffix.lower() != ".wav":
            raise ValueError(f"--out must name a .wav file, got {str(target)!r}")
        paths = [target] if len(texts) == 1 else [target.with_name(f"{target.stem}_{i}.wav")
                                                   for i in range(len(texts))]
        for path, text, audio in zip(paths, texts, out.audios):
            soundfile.write(str(path), audio, out.sampling_rate)
            print(f"{path}: {len(audio) / out.sampling_rate:.2f} s  {text}")
        print(f"{out.stats}  RTF {out.real_time_factor:.2f}")
        return 0

    # --- bench protocol (see mmspec.common.bench) ------------------------------------------------------
    def bench_inputs(self, num_samples: int, seed: int) -> list[dict]:
        from .tts_data import load_tts_test_set

        rows = load_tts_test_set()
        if num_samples > len(rows):
            raise ValueError(f"num_samples must be at most {len(rows)} (the held-out set), got {num_samples}")
        return rows[:num_samples]

    def bench_generate(self, inputs: list[dict], batch_size: int, seed: int, settings: dict):
        """Codes of each text flattened frame by frame ([K, T] -> T·K ints), so exact-match compares frames."""
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(inputs))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unfinished rows are counted in the stats
            out = self([row["text"] for row in inputs], generator=gens, batch_size=batch_size, **settings)
        return [c.T.flatten().tolist() for c in out.codes], out.stats

    def bench_quality(self, inputs: list[dict], sequences: list[list[int]]) -> dict:
        """Judge WER / CER (Whisper tiny.en and the bundled ASR) of the speech and its MCD to the recording."""
        import soundfile

        from .judge import tts_quality

        depth = self.codec.num_codebooks
        codes = [torch.tensor(s, dtype=torch.long, device=self.device).reshape(-1, depth).T for s in sequences]
        audios, _ = self.decode_audio(codes)
        references = [soundfile.read(row["audio"], dtype="float32")[0] for row in inputs]
        waves = [a.numpy() if a.numel() else np.zeros(self.sampling_rate // 10, np.float32) for a in audios]
        return tts_quality([row["text"] for row in inputs], waves, self.sampling_rate, references=references,
                           judges=("whisper", "asr-tiny"))

    def bench_compare(self, inputs: list[dict], baseline: list[list[int]], accelerated: list[list[int]]) -> dict:
        """Per-level code histograms of the two sides (sampled runs draw different codes, so a lossless plugin
        shows up as histograms that differ no more than chance): the total-variation distance per level, and
        the same distance between random re-splits of the pooled texts (a permutation null, texts kept
        whole because a text's frames are correlated) as its noise level."""
        depth = self.codec.num_codebooks

        def histograms(sequences) -> torch.Tensor:
            """[len, depth, codebook_size] code counts per text and level."""
            out = torch.zeros(len(sequences), depth, self.codec.codebook_size)
            for i, sequence in enumerate(sequences):
                codes = torch.tensor(sequence, dtype=torch.long).reshape(-1, depth)
                out[i].scatter_add_(1, codes.T, torch.ones(depth, codes.shape[0]))
            return out

        def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            a, b = a.sum(0), b.sum(0)
            return 0.5 * (a / a.sum(-1, keepdim=True).clamp(min=1) - b / b.sum(-1, keepdim=True).clamp(min=1)
                          ).abs().sum(-1)

        base, acc = histograms(baseline), histograms(accelerated)
        observed = distance(base, acc)
        pooled = torch.cat([base, acc])
        rng = torch.Generator().manual_seed(0)
        null = torch.stack([distance(pooled[order[: len(base)]], pooled[order[len(base):]])
                            for order in (torch.randperm(len(pooled), generator=rng) for _ in range(200))])
        return {"code_tv_per_level": observed.tolist(), "code_tv_null_mean_per_level": null.mean(0).tolist(),
                # how often a chance split is at least as far apart, level by level (small: a real difference)
                "code_tv_pvalue_per_level": ((null >= observed).float().mean(0)).tolist(),
                "frames": [sum(len(s) for s in baseline) // depth, sum(len(s) for s in accelerated) // depth]}

    def bench_summary(self, inputs: list[dict], stats: DecodeStats, seconds: float) -> dict:
        """Real-time factor and where the time went: backbone, depth decoder, codec."""
        extra = stats.extra
        audio = extra.get(AUDIO_OUT_SECONDS, 0.0)
        split = {name: extra.get(key, 0.0) for name, key in
                 (("backbone", TIME_BACKBONE), ("depth", TIME_DEPTH), ("codec", TIME_CODEC))}
        total = sum(split.values()) or 1.0
        return {"rtf": seconds / audio if audio else float("inf"), "audio_seconds": audio,
                "time_split_by_stage_s": split,
                "frames": extra.get(FRAMES, 0), "depth_calls_per_frame": stats.row_steps / max(1, extra.get(FRAMES, 0)),
                "time_share": {name: value / total for name, value in split.items()},
                "unfinished": extra.get(UNFINISHED_ROWS, 0)}

    @classmethod
    def bench_sections(cls, results: list[dict]) -> list[tuple[str, str, str]]:
        from .bench import rvq_table, tts_table

        table = tts_table(results)
        if not table:
            return []
        sections = [("Speech synthesis: judge word error, real-time factor and the depth decoder's share",
                     "Whisper tiny.en (faster-whisper, int8) and the bundled asr-tiny transcribe the synthesized "
                     "speech of held-out sentences; MCD (dB, MFCC + DTW) is against the Piper recording of the "
                     "same sentence. RTF = compute seconds per second of audio (< 1 is faster than real time). "
                     "Depth share = the depth decoder's part of the wall time (backbone, depth decoder, codec).",
                     table)]
        rvq = rvq_table(results)
        if rvq:
            sections.append(("RVQ speculation of the depth decoder (`rvq_spec`)",
                             "Per frame the backbone emits level 0 and the depth decoder levels 1 … 7; plain AR "
                             "needs 7 depth calls per frame. Codes / call = codes committed per depth call "
                             "(the first call of a frame has nothing to draft from and commits one). RVQ speed-up "
                             "= depth-decoder wall time AR / plugin (the part the plugin changes); end to end = "
                             "whole TTS wall time, backbone and codec included. Code TV = total-variation "
                             "distance between the two sides' code histograms, largest over levels 1-7, next to "
                             "the mean of the same distance between random re-splits of the pooled texts "
                             "(equal within noise is what a lossless plugin must show under sampling). Whisper "
                             "WER of the bundled TTS is above 100 % (not yet intelligible, see docs/tts.md), so "
                             "its parity says little; the code histograms and the exact-law tests do.", rvq))
        return sections


def save_tts_bundle(directory: str | os.PathLike, model, tokenizer: CharTokenizer, codec) -> None:
    """Write the bundled format (weights in fp16 to keep the repository small; loading casts them back)."""
    import copy

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    copy.deepcopy(model).to(torch.float16).save_pretrained(directory / "model")
    copy.deepcopy(codec).to(torch.float16).save_pretrained(directory / "codec")
    tokenizer.save_pretrained(str(directory))


def bundled_pipeline(device: str = "cpu") -> TTSPipeline:
    if not (BUNDLED_TTS_DIR / "model").exists():
        raise FileNotFoundError(f"the bundled TTS model is missing from {BUNDLED_TTS_DIR}")
    return TTSPipeline.from_pretrained(BUNDLED_TTS_DIR, device=device)
