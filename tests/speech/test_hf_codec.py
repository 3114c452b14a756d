"""HFCodec over tiny random DAC / EnCodec / Mimi models: the AudioCodec shapes and lengths, each row of a batch
coded as if alone, codebook subsets, and the errors."""

import pytest
import torch
from transformers import DacConfig, DacModel, EncodecConfig, EncodecModel, MimiConfig, MimiModel

from mmspec.speech.hf_codec import HFCodec


def tiny(kind):
    torch.manual_seed(0)
    if kind == "dac":  # hop 8, 3 x 16 codes
        return DacModel(DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 4], decoder_hidden_size=16,
                                  n_codebooks=3, codebook_size=16, codebook_dim=4, sampling_rate=16000))
    if kind == "encodec":  # hop 8, 2000 frames/s x 4 bits: 8 kbit/s per codebook, so 24 kbit/s gives 3
        return EncodecModel(EncodecConfig(sampling_rate=16000, hidden_size=8, num_filters=4, upsampling_ratios=[4, 2],
                                          codebook_size=16, target_bandwidths=[8.0, 24.0], num_lstm_layers=1))
    # hop 16 (ratios 4 x 2, then the stride-2 downsampling to the latent rate), 1 semantic + 2 acoustic codebooks
    return MimiModel(MimiConfig(sampling_rate=16000, hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                                codebook_size=16, codebook_dim=8, vector_quantization_hidden_dimension=8,
                                num_quantizers=3, num_semantic_quantizers=1, upsample_groups=16, num_hidden_layers=1,
                                intermediate_size=32, num_attention_heads=2, num_key_value_heads=2, sliding_window=16,
                                max_position_embeddings=256))


KINDS = ["dac", "encodec", "mimi"]
HOPS = {"dac": 8, "encodec": 8, "mimi": 16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Convolutions this small are all thread hand-off: on busy cores a second thread makes them ~100x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=KINDS)
def codec(request):
    return HFCodec(tiny(request.param))


def test_protocol_attributes(codec):
    assert codec.sampling_rate == 16000 and codec.codebook_size == 16 and codec.num_codebooks == 3
    assert codec.hop_length == HOPS[codec.kind] and codec.frame_rate == 16000 / HOPS[codec.kind]
    assert codec.causal == (codec.kind != "dac")


def test_encode_decode_shapes_and_lengths(codec):
    hop = codec.hop_length
    lengths = torch.tensor([40 * hop + 3, 25 * hop])  # row 0 ends inside a frame
    waves = torch.randn(2, 41 * hop + 1) * 0.3  # and the tensor is wider than the longest row
    codes, frame_lengths = codec.encode(waves, lengths)
    assert codes.dtype == torch.long and codes.shape == (2, 3, 41)
    assert frame_lengths.tolist() == [41, 25]
    assert int(codes.min()) >= 0 and int(codes.max()) < 16 and bool((codes[1, :, 25:] == 0).all())
    audio, audio_lengths = codec.decode(codes, frame_lengths)
    assert audio.dtype == torch.float32 and audio.shape == (2, 41 * hop)
    assert audio_lengths.tolist() == [41 * hop, 25 * hop]
    assert bool(torch.isfinite(audio).all()) and bool((audio[1, 25 * hop:] == 0).all())
    assert float(audio[1, : 25 * hop].abs().max()) > 0
    again, again_lengths = codec.encode(audio, audio_lengths)  # decoded lengths are whole frames: same count
    assert again.shape == codes.shape and again_lengths.tolist() == frame_lengths.tolist()
    full, full_lengths = codec.encode(waves)  # lengths default to the full width
    assert full.shape == (2, 3, 42) and full_lengths.tolist() == [42, 42]


def test_each_row_of_a_batch_is_coded_as_if_alone(codec):
    hop = codec.hop_length
    short, long = torch.randn(30 * hop) * 0.3, torch.randn(50 * hop) * 0.3
    batch = torch.stack([torch.cat([short, torch.zeros(20 * hop)]), long])
    codes, frame_lengths = codec.encode(batch, torch.tensor([30 * hop, 50 * hop]))
    alone, _ = codec.encode(short[None])
    assert torch.equal(codes[0, :, :30], alone[0])
    audio, _ = codec.decode(codes, frame_lengths)
    audio_alone, _ = codec.decode(alone)
    torch.testing.assert_close(audio[0, : 30 * hop], audio_alone[0], atol=1e-5, rtol=1e-4)


def test_dac_batch_padding_reaches_the_last_frames_so_rows_run_apart():
    # Why HFCodec runs DAC rows of different lengths separately: in the model's own batch call, the padding after
    # a shorter row changes its last latent frames (biases make padded activations non-zero; the convolutions'
    # own zero padding does not look like them). Earlier frames are untouched.
    model = tiny("dac").eval()
    short = torch.randn(1, 1, 30 * 8)
    batch = torch.cat([torch.cat([short, torch.zeros(1, 1, 20 * 8)], -1), torch.randn(1, 1, 50 * 8)])
    with torch.no_grad():
        alone, batched = model.encoder(short)[0], model.encoder(batch)[0, :, :30]
    change = (alone - batched).abs().amax(0)
    assert float(change[-1]) > 1e-5 and float(change[:-4].max()) < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_fewer_codebooks_are_the_first_ones(kind):
    model = tiny(kind)
    waves = torch.randn(2, 24 * HOPS[kind]) * 0.3
    full, _ = HFCodec(model).encode(waves)
    fewer = HFCodec(model, num_codebooks=2)
    codes, _ = fewer.encode(waves)
    assert fewer.num_codebooks == 2 and torch.equal(codes, full[:, :2])
    audio, lengths = fewer.decode(codes)
    assert audio.shape == (2, 24 * HOPS[kind]) and lengths.tolist() == [24 * HOPS[kind]] * 2
    with pytest.raises(ValueError, match=r"num_codebooks must be an int in \d\.\.3"):
        HFCodec(model, num_codebooks=4)
    with pytest.raises(ValueError, match="num_codebooks"):
        HFCodec(model, num_codebooks=0)


def test_encodec_picks_the_smallest_bandwidth_with_enough_codebooks():
    model = tiny("encodec")
    assert HFCodec(model, num_codebooks=1).bandwidth == 8.0
    assert HFCodec(model, num_codebooks=2).bandwidth == 24.0 and HFCodec(model).bandwidth == 24.0


def test_unsupported_models_are_refused():
    with pytest.raises(TypeError, match="DacModel, EncodecModel, MimiModel.*Linear"):
        HFCodec(torch.nn.Linear(2, 2))
    torch.manual_seed(0)
    chunked = EncodecModel(EncodecConfig(sampling_rate=16000, hidden_size=8, num_filters=4, upsampling_ratios=[4, 2],
                                         codebook_size=16, target_bandwidths=[24.0], num_lstm_layers=1,
                                         normalize=True, chunk_length_s=0.01, overlap=0.1))
    with pytest.raises(ValueError, match="chunk_length_s=None, normalize=False"):
        HFCodec(chunked)


def test_bad_inputs_name_the_argument():
    codec = HFCodec(tiny("mimi"))
    codes, _ = codec.encode(torch.randn(1, 160))
    with pytest.raises(ValueError, match="codes have 2 codebooks; this codec has 3"):
        codec.decode(codes[:, :2])
    with pytest.raises(ValueError, match=r"codes must lie in 0\.\.15, got 0\.\.16"):
        codec.decode(codes.clamp(max=0) + torch.tensor([0, 0, 16])[None, :, None])
    with pytest.raises(ValueError, match="codes must be an integer tensor"):
        codec.decode(codes.float())
    with pytest.raises(ValueError, match="frame_lengths"):
        codec.decode(codes, torch.tensor([codes.shape[-1] + 1]))
    with pytest.raises(ValueError, match="waves must be a float tensor"):
        codec.encode(torch.randn(160))
    with pytest.raises(ValueError, match="lengths"):
        codec.encode(torch.randn(2, 160), torch.tensor([160, 161]))
