"""The speech substrate: text normalisation and tokenizer, corpus cleaning, the ASR model's cached decoder,
ASRPipeline inputs and errors, save/load, metrics."""

import numpy as np
import pytest
import soundfile
import torch

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.speech.asr_model import ASRDecoderAdapter
from mmspec.speech.data import closed_vocabulary_sentences, load_test_set, split_sentences
from mmspec.speech.metrics import error_counts, error_rates, inverse_real_time_factor
from mmspec.speech.pipeline import ASRPipeline, load_audio
from mmspec.speech.recognizer import BundledRecognizer
from mmspec.speech.text import CharTokenizer, fortune_sentences, normalize_text
from tiny_models import tiny_asr_model


@pytest.fixture(scope="module")
def test_rows():
    return load_test_set()


def test_normalisation_and_tokenizer_round_trip():
    assert normalize_text("  Don't PANIC -- it's   only 42!") == "don't panic it's only"
    tok = CharTokenizer()
    ids = tok.encode("Hello, World")
    assert tok.decode(ids) == "hello world" and min(ids) >= 3
    assert tok.decode(ids + [tok.eos_id, 5, 6]) == "hello world"  # stops at end-of-text
    assert tok.vocab_size == 31
    with pytest.raises(ValueError, match="unique"):
        CharTokenizer("aab")


def test_fortune_cleaning(tmp_path):
    (tmp_path / "quotes").write_text(
        "The cat sat on the mat. It was 5 o'clock.\n\t\t-- Anonymous\n%\n"
        "BOB: Mr. Smith went to NASA today. You are 'never' alone here.\n%\nToo short.\n")
    (tmp_path / "quotes.dat").write_text("binary")
    assert fortune_sentences(str(tmp_path)) == ["the cat sat on the mat", "you are never alone here"]
    with pytest.raises(FileNotFoundError, match="fortunes"):
        fortune_sentences(str(tmp_path / "missing"))


def test_split_is_by_sentence_and_deterministic():
    sentences = [f"sentence number {i}" for i in range(50)]
    train, test = split_sentences(sentences, 10, seed=3)
    assert len(test) == 10 and not set(train) & set(test) and sorted(train + test) == sorted(sentences)
    assert split_sentences(sentences, 10, seed=3) == (train, test)


def test_committed_test_set_is_readable_and_disjoint_from_training_text(test_rows):
    assert len(test_rows) == 200
    info = soundfile.info(test_rows[0]["audio"])
    assert info.samplerate == 16000 and info.channels == 1
    assert all(r["text"] == normalize_text(r["text"]) for r in test_rows)
    try:
        train, test = split_sentences(closed_vocabulary_sentences(), 200)
    except FileNotFoundError:  # the fortunes package is only needed to regenerate data
        return
    assert sorted(r["text"] for r in test_rows) == test and not set(test) & set(train)


def test_cached_decoder_matches_a_full_forward(test_rows):
    model = tiny_asr_model()
    waves = [load_audio(r["audio"]) for r in test_rows[:3]]
    padded = torch.nn.utils.rnn.pad_sequence(waves, batch_first=True)
    lengths = torch.tensor([w.numel() for w in waves])
    with torch.no_grad():
        enc = model.encode(padded, lengths)
        tokens = torch.randint(3, 31, (3, 9))
        _, full = model(*model.log_mel(padded, lengths), tokens)
        adapter = ASRDecoderAdapter(model, enc)
        state, first = adapter.prefill(tokens[:, :4])
        rest = adapter.forward(state, tokens[:, 4:], torch.arange(4, 9).expand(3, -1)).logits
        torch.testing.assert_close(torch.cat([first.logits, rest], 1), full.float(), rtol=1e-4, atol=1e-4)
        # Each row alone: padding of the encoder batch changes nothing.
        alone = model.encode(waves[1][None], lengths[1:2])
        s1, o1 = ASRDecoderAdapter(model, alone).prefill(tokens[1:2])
        torch.testing.assert_close(o1.logits, torch.cat([first.logits, rest], 1)[1:2], rtol=1e-4, atol=1e-4)
        # Rows leave: the cross-attention state follows.
        adapter.select_rows(state, torch.tensor([2, 0]))
        nxt = adapter.forward(state, tokens[[2, 0], :1], torch.full((2, 1), 9)).logits
        assert nxt.shape == (2, 1, 31)
        # A decode call that would pass max_text_positions is refused before its first forward.
        limit = adapter.max_positions
        assert limit == model.config.max_text_positions
        decoder = SpeculativeDecoder(ASRDecoderAdapter(model, enc))
        with pytest.raises(ValueError, match=f"lower max_new_tokens to at most {limit - 2}$"):
            decoder.generate(tokens[:, :3], max_new_tokens=limit)
        assert decoder.generate(tokens[:, :3], max_new_tokens=2).sequences.shape == (3, 2)


def test_pipeline_accepts_every_input_form_and_agrees(tmp_path, test_rows):
    pipe = ASRPipeline(BundledRecognizer(tiny_asr_model()))
    path = test_rows[0]["audio"]
    wave, rate = soundfile.read(path, dtype="float32")
    ref = pipe(path, max_new_tokens=8).sequences
    assert pipe(wave, sampling_rate=rate, max_new_tokens=8).sequences == ref
    assert pipe(torch.from_numpy(wave), sampling_rate=16000, max_new_tokens=8).sequences == ref
    assert pipe((wave, 16000), max_new_tokens=8).sequences == ref
    assert pipe({"array": wave, "sampling_rate": 16000}, max_new_tokens=8).sequences == ref
    pcm = (wave * 32767).astype(np.int16)
    assert len(pipe(pcm, sampling_rate=16000, max_new_tokens=8).texts) == 1
    # Other rates are resampled: a 22.05 kHz copy transcribes like the original resampled.
    import torchaudio

    up = torchaudio.functional.resample(torch.from_numpy(wave), 16000, 22050)
    out = pipe([up.numpy(), path], sampling_rate=22050, max_new_tokens=8, batch_size=2)
    assert len(out.texts) == 2 and out.stats.extra["audio_seconds"] > 0
    # Batched == one by one.
    many = [r["audio"] for r in test_rows[:5]]
    assert pipe(many, batch_size=5, max_new_tokens=8).sequences == pipe(many, batch_size=1, max_new_tokens=8).sequences
    # save / from_pretrained round trip.
    pipe.save_pretrained(tmp_path / "asr")
    again = ASRPipeline.from_pretrained(tmp_path / "asr")
    assert again(path, max_new_tokens=8).sequences == ref
    assert pipe(path, max_new_tokens=8, return_dict=False)[0] == pipe(path, max_new_tokens=8).texts


def test_bad_audio_gets_clear_errors(tmp_path):
    pipe = ASRPipeline(BundledRecognizer(tiny_asr_model()))
    with pytest.raises(ValueError, match="empty"):
        pipe(np.zeros(0, dtype=np.float32), sampling_rate=16000)
    with pytest.raises(ValueError, match="empty list"):
        pipe([])
    with pytest.raises(TypeError, match="sampling_rate must be a positive int"):
        pipe(np.zeros(16000, dtype=np.float32), sampling_rate="16000")
    with pytest.raises(TypeError, match="sampling_rate must be a positive int"):
        pipe(np.zeros(16000, dtype=np.float32), sampling_rate=16000.0)
    with pytest.raises(ValueError, match="needs sampling_rate"):
        pipe(np.zeros(16000, dtype=np.float32))
    with pytest.raises(ValueError, match=r"with at most 8 channels; got shape \(20, 16000\)"):  # no side is plainly
        pipe(np.zeros((20, 16000), dtype=np.float32), sampling_rate=16000)  # the channels
    with pytest.raises(ValueError, match=r"\[channels, samples\] / \[samples, channels\]"):
        pipe(np.zeros((2, 2, 16000), dtype=np.float32), sampling_rate=16000)
    bad = np.zeros(16000, dtype=np.float32)
    bad[100] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        pipe(bad, sampling_rate=16000)
    with pytest.raises(FileNotFoundError, match="no such audio file"):
        pipe(str(tmp_path / "nope.wav"))
    with pytest.raises(ValueError, match="too short"):
        pipe(np.zeros(100, dtype=np.float32), sampling_rate=16000)
    with pytest.raises(ValueError, match="batch_size"):
        pipe(np.zeros(16000, dtype=np.float32), sampling_rate=16000, batch_size=0)
    with pytest.raises(TypeError, match="file path"):
        pipe([[0.0] * 1000], sampling_rate=16000)


def test_multichannel_arrays_and_files_are_averaged_to_mono_with_one_notice(tmp_path, test_rows):
    pipe = ASRPipeline(BundledRecognizer(tiny_asr_model()))
    wave, rate = soundfile.read(test_rows[0]["audio"], dtype="float32")
    ref = pipe(wave, sampling_rate=rate, max_new_tokens=8).sequences
    # Channels whose mean is the clip: the mono model hears the clip itself, in either array layout.
    both = np.stack([wave * 0.5, wave * 1.5])
    for array in (both, both.T, torch.from_numpy(both)):
        with pytest.warns(UserWarning, match=r"^audio\[0\]: 2 channels downmixed to mono$"):
            assert pipe(array, sampling_rate=rate, max_new_tokens=8).sequences == ref
    path = tmp_path / "stereo.wav"
    soundfile.write(path, both.T, rate, subtype="FLOAT")
    with pytest.warns(UserWarning, match=rf"^audio\[0\] {str(path)!r}: 2 channels downmixed to mono$"):
        assert pipe(str(path), max_new_tokens=8).sequences == ref
    with pytest.warns(UserWarning, match=r"^audio\[0\]: 22050 Hz resampled to 16000 Hz$"):
        pipe(np.zeros(22050, dtype=np.float32), sampling_rate=22050, max_new_tokens=2)
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", "downmixed|resampled")  # mono 16 kHz needs no conversion: no notice
        pipe(wave, sampling_rate=rate, max_new_tokens=2)
        load_audio((both, rate), notice=False)  # a caller converting on purpose (the TTS judge) is not told
    # The manifest check of `mmspec batch` takes stereo files too.
    assert pipe.batch_input({"audio": "stereo.wav"}, tmp_path) == str(path)


def test_every_bad_audio_input_is_named_in_one_error_before_any_model_work(tmp_path, test_rows, monkeypatch):
    pipe = ASRPipeline(BundledRecognizer(tiny_asr_model()))

    def no_model_work(*args, **kwargs):
        raise AssertionError("the model ran before the inputs were checked")

    monkeypatch.setattr(pipe.recognizer, "encode", no_model_work)
    monkeypatch.setattr(pipe, "decode", no_model_work)
    (tmp_path / "page.png").write_bytes(b"\x89PNG not audio")
    good = test_rows[0]["audio"]
    missing, image = str(tmp_path / "x.wav"), str(tmp_path / "page.png")
    with pytest.raises(ValueError) as caught:
        pipe([good, missing, good, image, np.zeros(100, dtype=np.float32)], sampling_rate=16000)
    message = str(caught.value)
    assert message == (f"audio: 3 of 5 inputs cannot be used: audio[1]: no such audio file {missing!r}; "
                       f"audio[3]: {image!r} is not an audio file soundfile can read (wav, flac, ogg, mp3); "
                       "audio[4]: audio is too short (100 samples at 16 kHz; need at least 400)")
    # Only missing files: still a FileNotFoundError, naming each.
    with pytest.raises(FileNotFoundError, match=r"2 of 3 inputs .*audio\[0\]: no such .*; audio\[2\]: no such"):
        pipe([missing, good, missing + "2"])
    # A call setting is checked once, not once per input.
    with pytest.raises(TypeError, match="^sampling_rate must be a positive int"):
        pipe([np.zeros(16000, dtype=np.float32)] * 3, sampling_rate=16000.0)


def test_progress_is_a_plain_line_per_batch_when_stderr_is_not_a_terminal(test_rows, capfd):
    import warnings

    pipe = ASRPipeline(BundledRecognizer(tiny_asr_model()))
    clips = [r["audio"] for r in test_rows[:3]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cut transcripts (max_new_tokens=2) would print on stderr too
        pipe(clips, batch_size=2, max_new_tokens=2)
        lines = capfd.readouterr().err.splitlines()
        assert [line.split(",")[0] for line in lines] == ["transcribing: batch 1/2: 2/3 utterances",
                                                          "transcribing: batch 2/2: 3/3 utterances"]
        assert all(line.endswith(" s") and "\r" not in line for line in lines)
        pipe.set_progress_bar_config(disable=True)
        pipe(clips, batch_size=2, max_new_tokens=2)
        pipe.set_progress_bar_config(disable=None)  # tqdm's "a bar on a terminal only": no lines either
        pipe(clips, batch_size=2, max_new_tokens=2)
        assert capfd.readouterr().err == ""


def test_error_rates_and_rtf():
    rates = error_rates(["the cat sat", "a dog"], ["the cat sad", "A dog!"])
    assert rates["wer"] == pytest.approx(1 / 5) and rates["cer"] == pytest.approx(1 / 16)
    assert error_rates(["one two"], [""])["wer"] == 1.0
    # per utterance (errors, reference length), summing to the corpus rates: what the bench bootstraps
    counts = error_counts(["the cat sat", "a dog", "one two"], ["the cat sad", "A dog!", "one two three"])
    assert counts["wer"] == ([1, 0, 1], [3, 2, 2]) and counts["cer"] == ([1, 0, 6], [11, 5, 7])
    with pytest.raises(ValueError, match="empty"):
        error_rates(["!!"], ["x"])
    assert inverse_real_time_factor(2.0, 10.0) == 5.0
