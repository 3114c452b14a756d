"""Text to speech: Piper data, the RVQ spectral codec, the CSM-shaped TTS model and `TTSPipeline`.

Everything but the bundled-model tests runs on tiny random models, so it checks the code, not the weights.
"""

import warnings

import numpy as np
import pytest
import torch

from mmspec.speech.codec import SpectralRVQCodec
from mmspec.speech.text import CharTokenizer
from mmspec.speech.tts_model import DepthDecoderAR, tiny_csm_config
from mmspec.speech.tts_pipeline import TTSPipeline

TINY_CODEC = dict(dim=32, ffn=64, fine_dim=16, encoder_blocks=2, decoder_blocks=2, fine_blocks=1, codebook_size=64)
TINY_TTS = dict(codebook_size=64, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                depth_hidden_size=64, depth_layers=2, depth_heads=2, depth_intermediate_size=128)
TEXTS = ["a fool and his money", "hello there", "we are what we repeatedly do"]


def tiny_pipeline(seed: int = 0, **overrides) -> TTSPipeline:
    from transformers import CsmForConditionalGeneration

    torch.manual_seed(seed)
    codec = SpectralRVQCodec(**TINY_CODEC).eval()
    model = CsmForConditionalGeneration(tiny_csm_config(**{**TINY_TTS, **overrides}))
    pipe = TTSPipeline(model, CharTokenizer(), codec)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generators(n: int, offset: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(offset + i) for i in range(n)]


# ------------------------------------------------------------------------------------------------ codec
def test_codec_shapes_lengths_and_batch_independence():
    torch.manual_seed(0)
    codec = SpectralRVQCodec(**TINY_CODEC).eval()
    assert codec.frame_rate == 25 and codec.num_codebooks == 8
    waves = torch.randn(2, 16000) * 0.1
    codes, frames = codec.encode(waves, torch.tensor([16000, 9000]))
    assert codes.shape == (2, 8, 25) and codes.dtype == torch.long and frames.tolist() == [25, 15]
    assert int(codes.max()) < 64 and int(codes.min()) >= 0
    alone, _ = codec.encode(waves[1:, :9000])
    assert torch.equal(alone[0], codes[1, :, :15])  # padding in the batch does not change a row's codes
    audio, samples = codec.decode(codes, frames)
    assert audio.shape == (2, 16000) and samples.tolist() == [16000, 9600]
    assert bool((audio[1, 9600:] == 0).all())
    solo, _ = codec.decode(codes[1:, :, :15])
    torch.testing.assert_close(solo[0], audio[1, :9600], rtol=0, atol=1e-5)


def test_codec_rejects_bad_codes_and_waves():
    codec = SpectralRVQCodec(**TINY_CODEC).eval()
    with pytest.raises(ValueError, match="codes have 4 codebooks; this codec has 8"):
        codec.decode(torch.zeros(1, 4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"codes must lie in 0\.\.63"):
        codec.decode(torch.full((1, 8, 3), 64))
    with pytest.raises(ValueError, match="waves must be a float tensor"):
        codec.encode(torch.zeros(16000))
    with pytest.raises(ValueError, match="lengths must be"):
        codec.encode(torch.zeros(1, 1000), torch.tensor([2000]))


@pytest.mark.train
def test_codec_training_losses_fall():
    import soundfile

    from mmspec.speech.tts_data import load_tts_test_set

    torch.manual_seed(0)
    codec = SpectralRVQCodec(**TINY_CODEC)
    waves = torch.stack([torch.from_numpy(soundfile.read(row["audio"], dtype="float32")[0][:20480])
                         for row in load_tts_test_set()[:4]])
    optimizer = torch.optim.Adam(codec.parameters(), lr=3e-3)
    history = []
    for _ in range(30):
        losses = codec.reconstruction_losses(waves, torch.full((4,), 20480))
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
        history.append(float(losses["loss"].detach()))
    assert history[-1] < 0.8 * history[0]
    assert all(name in losses for name in ("log_magnitude_l1", "spectral_convergence", "mel_l1", "commitment"))


# ------------------------------------------------------------------------------------------ depth decoder
def test_depth_decoder_chunk_matches_step_by_step():
    """Verifying several codes in one forward (what RVQ speculation does) gives the sequential logits."""
    pipe = tiny_pipeline()
    depth = pipe.model.depth_decoder
    hidden = torch.randn(2, 64)
    codes = torch.randint(0, 64, (2, 8))
    ar = DepthDecoderAR(depth, hidden, 64)
    state, _ = ar.prefill(torch.zeros(2, 1, dtype=torch.long))
    chunk = ar.forward(state, codes[:, :5], torch.arange(1, 6).expand(2, -1)).logits
    state, _ = ar.prefill(torch.zeros(2, 1, dtype=torch.long))
    steps = [ar.forward(state, codes[:, i:i + 1], torch.full((2, 1), i + 1)).logits for i in range(5)]
    torch.testing.assert_close(chunk, torch.cat(steps, 1), rtol=1e-4, atol=1e-5)
    assert bool(torch.isinf(chunk[..., 64:]).all())  # end of speech is no code below level 0
    # The same as the transformers module's own forward over [hidden, cb0..cb4] (position-indexed heads).
    inner = depth.model
    embeds = torch.cat([hidden[:, None], inner.embed_tokens(codes[:, :5] + torch.arange(5) * 65)], 1)
    reference = depth(inputs_embeds=embeds).logits[..., :64]
    torch.testing.assert_close(chunk[..., :64], reference, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- pipeline
def test_batch_equals_one_by_one_and_seeds_repeat():
    pipe = tiny_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = pipe(TEXTS, generator=generators(3), max_new_frames=12, batch_size=3)
        alone = [pipe(t, generator=generators(1, i)[0], max_new_frames=12) for i, t in enumerate(TEXTS)]
        again = pipe(TEXTS, generator=generators(3), max_new_frames=12, batch_size=2)
    for i in range(3):
        assert torch.equal(batch.codes[i], alone[i].codes[0])
        assert torch.equal(batch.codes[i], again.codes[i])
        # The codes are identical; the waveform comes from the codec's convolutions over a padded batch, whose
        # CPU kernels pick their algorithm by batch shape, so float32 rounding differs by a few 1e-5 on some
        # machines (CI saw 3.4e-5). 1e-4 is -80 dBFS: far below any audible or content difference.
        np.testing.assert_allclose(batch.audios[i], alone[i].audios[0], atol=1e-4)
    assert batch.codes[0].shape[0] == 8 and batch.sampling_rate == 16000
    assert not torch.equal(batch.codes[0], batch.codes[1][:, : batch.codes[0].shape[1]])
    stats = batch.stats
    assert stats.extra["frames"] == sum(c.shape[1] for c in batch.codes)
    assert stats.num_rows == 3 and stats.row_steps == 7 * stats.extra["frames"]  # K-1 depth calls per frame
    assert stats.extra["audio_out_seconds"] == pytest.approx(sum(len(a) for a in batch.audios) / 16000)


def test_end_of_speech_stops_a_row_and_others_go_on():
    pipe = tiny_pipeline()
    eos = pipe.model.config.codebook_eos_token_id
    with torch.no_grad():  # make end of speech certain after the text of row 1 ("hi") only: bias the head
        pipe.model.lm_head.weight[eos] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_plain = pipe(["hi", "hello there"], generator=generators(2), max_new_frames=6, output_type="pt")
    assert isinstance(out_plain.audios[0], torch.Tensor)
    with torch.no_grad():
        pipe.model.lm_head.weight[eos] = 50 * pipe.model.lm_head.weight[:64].mean(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pipe(["hi", "hello there"], generator=generators(2), max_new_frames=6)
    ended = [c.shape[1] < 6 for c in out.codes]
    assert ended == out.finished
    assert len(caught) == sum(not f for f in out.finished)


def test_greedy_is_deterministic_without_generators():
    pipe = tiny_pipeline()
    settings = dict(temperature=0.0, depth_temperature=0.0, max_new_frames=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = pipe(TEXTS[:2], **settings), pipe(TEXTS[:2], **settings)
    assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes))


def test_save_load_round_trip(tmp_path):
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path)
    loaded = TTSPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Weights are stored in fp16; compare the reloaded pipeline with itself over two calls and with the
        # fp16-rounded original.
        pipe.model.to(torch.float16).to(torch.float32)
        pipe.codec.to(torch.float16).to(torch.float32)
        a = pipe(TEXTS[:2], generator=generators(2), max_new_frames=8)
        b = loaded(TEXTS[:2], generator=generators(2), max_new_frames=8)
    assert all(torch.equal(x, y) for x, y in zip(a.codes, b.codes))
    assert (tmp_path / "model" / "config.json").exists() and (tmp_path / "codec" / "config.json").exists()


def test_bad_inputs_fail_before_any_work():
    pipe = tiny_pipeline()
    cases = [
        (dict(text=""), "text is empty"),
        (dict(text=["ok", "  "]), r"text\[1\] is empty"),
        (dict(text="?!"), "text has no speakable characters"),
        (dict(text="call 911"), "text contains characters this voice cannot read: '1', '9'"),
        (dict(text=[]), "text must be a non-empty string or a non-empty list of strings"),
        (dict(text="hi", max_new_frames=0), "max_new_frames must be an int >= 1, got 0"),
        (dict(text="hi", output_type="pil"), "output_type must be one of np, pt"),
        (dict(text="hi", top_k=0), "top_k must be None or an int >= 1"),
        (dict(text="hi", depth_temperature=-1.0), "temperature must be a number >= 0"),
        (dict(text=["a b", "c d"], generator=generators(1)), "generator must be a torch.Generator or a list of 2"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            pipe(**kwargs)


def test_a_codec_that_does_not_match_the_model_is_refused():
    from transformers import CsmForConditionalGeneration

    model = CsmForConditionalGeneration(tiny_csm_config(**{**TINY_TTS, "num_codebooks": 4}))
    with pytest.raises(ValueError, match="the codec has 8 codebooks but the TTS model predicts 4"):
        TTSPipeline(model, CharTokenizer(), SpectralRVQCodec(**TINY_CODEC))
    model = CsmForConditionalGeneration(tiny_csm_config(**{**TINY_TTS, "codebook_size": 32}))
    with pytest.raises(ValueError, match=r"codebook size \(64\) exceeds"):
        TTSPipeline(model, CharTokenizer(), SpectralRVQCodec(**TINY_CODEC))


@pytest.mark.train
def test_training_losses_backpropagate_into_both_levels():
    from transformers import CsmForConditionalGeneration

    from mmspec.speech.tts_model import training_losses

    torch.manual_seed(0)
    config = tiny_csm_config(**TINY_TTS)
    config._attn_implementation = "eager"
    model = CsmForConditionalGeneration(config)
    text = torch.randint(3, 31, (2, 9))
    codes = torch.randint(0, 64, (2, 11, 8))
    losses = training_losses(model, text, torch.tensor([9, 6]), codes, torch.tensor([11, 7]), depth_fraction=1.0)
    losses["loss"].backward()
    assert all(torch.isfinite(v) for v in losses.values())
    assert float(losses["guided_attention"].detach()) > 0
    assert model.depth_decoder.codebooks_head.weight.grad.abs().sum() > 0
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert model.embed_text_tokens.weight.grad.abs().sum() > 0


def test_runs_over_a_hugging_face_codec():
    """The same pipeline over a `transformers` Mimi (CSM's own codec) through HFCodec."""
    from transformers import CsmForConditionalGeneration, MimiConfig, MimiModel

    from mmspec.speech.hf_codec import HFCodec

    torch.manual_seed(0)
    mimi = MimiModel(MimiConfig(sampling_rate=16000, hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                                codebook_size=16, codebook_dim=8, vector_quantization_hidden_dimension=8,
                                num_quantizers=3, num_semantic_quantizers=1, upsample_groups=16, num_hidden_layers=1,
                                intermediate_size=32, num_attention_heads=2, num_key_value_heads=2, sliding_window=16,
                                max_position_embeddings=256))
    codec = HFCodec(mimi)
    model = CsmForConditionalGeneration(tiny_csm_config(**{**TINY_TTS, "num_codebooks": 3, "codebook_size": 16}))
    pipe = TTSPipeline(model, CharTokenizer(), codec)
    pipe.set_progress_bar_config(disable=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = pipe(TEXTS[:2], generator=generators(2), max_new_frames=6)
        alone = pipe(TEXTS[1], generator=generators(1, 1)[0], max_new_frames=6)
    assert batch.codes[1].shape[0] == 3 and int(batch.codes[1].max()) < 16
    assert torch.equal(batch.codes[1], alone.codes[0])
    assert len(batch.audios[1]) == batch.codes[1].shape[1] * codec.hop_length
    assert pipe.token_structure.depth == 3 and pipe.token_structure.codebook_size == 16
