"""Tiny random models shared by the tests (importable because pyproject puts tests/ on pythonpath)."""

import torch


def tiny_llama(vocab_size=64, layers=2, hidden=32, seed=0, eos_token_id=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=0, eos_token_id=eos_token_id,
                         pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def perturbed_copy(model, noise: float, seed: int = 1):
    """A draft that agrees with the target often but not always: ragged acceptance."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return draft.eval()


# --- tiny transformers Janus / Emu3 / Chameleon (image generation), shared by tests/vision ------------------

HF_CODES = 24  # codebook size of every tiny model
HF_TEXT = 40  # text part of the Emu3 / Chameleon vocabularies; image tokens follow, shuffled
HF_GRID = 4  # 4x4 code images
JANUS_BOI = 5  # Janus's <begin_of_image>
EMU3_BOI, EMU3_WRAPPER = 32, 33  # Emu3's <|image start|>, <|image token|>
CHAMELEON_BOI = 8  # Chameleon's <racm3:break> (begin image)


def spread_init(model, std=0.3, seed=0):
    """Random init with a larger scale, so greedy codes vary instead of repeating one token."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def shuffled_image_ids(seed=0):
    """LM ids of the HF_CODES image tokens, deliberately not in code order."""
    return (HF_TEXT + torch.randperm(HF_CODES, generator=torch.Generator().manual_seed(seed))).tolist()


def build_tiny_janus(seed=0):
    """Vision 64 px / 16 px patches: vq_config.num_patches = 4, consistent with num_image_tokens = 16 (as in
    real checkpoints), so `decode_image_tokens` accepts a generated image; the VQ decoder upsamples 2x."""
    from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

    torch.manual_seed(seed)
    text = dict(model_type="llama", vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1,
                pad_token_id=0, eos_token_id=2)
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16 * HF_GRID,
                  patch_size=16, projection_dim=32, num_image_tokens=HF_GRID * HF_GRID, mlp_ratio=2)
    vq = dict(embed_dim=8, num_embeddings=HF_CODES, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, num_hidden_layers=2)
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=3)
    model = spread_init(JanusForConditionalGeneration(config), seed=seed)
    # A generation config of its own, as checkpoints ship it (one derived from the model config would drop
    # generation_kwargs when saved and loaded again).
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                               generation_kwargs={"boi_token_id": JANUS_BOI})
    return model


def build_tiny_emu3(seed=0):
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    torch.manual_seed(seed)
    vocab = {f"<|visual token {c:06d}|>": i for c, i in enumerate(shuffled_image_ids(seed))}
    vocab.update({"<|extra_200|>": 30, "<image>": 31, "<|image token|>": EMU3_WRAPPER})  # EOL, input image, wrapper
    text = dict(vocab_size=HF_TEXT + HF_CODES, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, attention_dropout=0.0)
    vq = dict(codebook_size=HF_CODES, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, attn_resolutions=[], hidden_size=32, num_attention_heads=1,
              temporal_downsample_factor=1)
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab)
    return spread_init(Emu3ForConditionalGeneration(config), seed=seed)


def build_tiny_chameleon(seed=0):
    """vq resolution 8 with one downsampling: a 4x4 code grid (real checkpoints: 512 px / 16 = 32x32)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    letters = lambda c: "".join(chr(ord("A") + int(d)) for d in str(c))  # noqa: E731  (IMGIMG<digits as A-J>Z)
    vocab = {f"IMGIMG{letters(c)}Z": i for c, i in enumerate(shuffled_image_ids(seed))}
    vocab.update({"<image>": 31})
    vq = dict(embed_dim=8, num_embeddings=HF_CODES, latent_channels=32, resolution=2 * HF_GRID, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1)
    config = ChameleonConfig(vocab_size=HF_TEXT + HF_CODES, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2, vq_config=vq, vocabulary_map=vocab)
    return spread_init(ChameleonForConditionalGeneration(config), seed=seed)


def tiny_text_tokenizer(**special_tokens):
    """A word-level `PreTrainedTokenizerFast` built in memory whose ids fit every tiny model's text vocabulary.

    "a".."j" -> 10..19, digits -> 20..29 (one token each), "*" -> 34; <pad> 0, <s> 1 (BOS), </s> 2, <unk> 3;
    <begin_of_image> 5, <racm3:break> 8, <|image start|> 32, <|image token|> 33. It adds no BOS itself.
    special_tokens: named extra special tokens (e.g. boi_token="<begin_of_image>") exposed as attributes.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "<begin_of_image>": JANUS_BOI,
             "<racm3:break>": CHAMELEON_BOI, "<|image start|>": EMU3_BOI, "<|image token|>": EMU3_WRAPPER, "*": 34}
    vocab.update({c: 10 + i for i, c in enumerate("abcdefghij")})
    vocab.update({str(d): 20 + d for d in range(10)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", extra_special_tokens=special_tokens)



# ------------------------------------------------------------------------------------------------ speech
def tiny_asr_model(seed: int = 0, sharpen: float = 1.0):
    """A random 1-layer-encoder, 2-layer-decoder ASRModel (d 32, no dropout); `sharpen` scales its output
    layer so greedy decoding writes varied characters."""
    from mmspec.speech.asr_model import ASRModel

    torch.manual_seed(seed)
    model = ASRModel(encoder_dim=32, encoder_layers=1, encoder_heads=2, encoder_ffn=64, decoder_dim=32,
                     decoder_layers=2, decoder_heads=2, decoder_ffn=64, dropout=0.0).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model
