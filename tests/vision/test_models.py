"""The per-family ImageModel objects (mmspec.vision.models): each family reports its grid, codebook and
prompt choices, decodes codes to images of the right shape, and is picked by the transformer's class; a new
family is one registered class."""

import pytest
import torch
from diffusers import VQModel
from tiny_models import (
    CHAMELEON_BOI, EMU3_BOI, EMU3_WRAPPER, HF_CODES, HF_GRID, JANUS_BOI, build_tiny_chameleon, build_tiny_emu3,
    build_tiny_janus, tiny_llama, tiny_text_tokenizer,
)

from mmspec.vision.llamagen import LlamaGenModel
from mmspec.vision.models import (
    IMAGE_MODELS, ChameleonImageModel, Emu3ImageModel, ImageModel, JanusImageModel, LlamaGenImageModel,
    image_model_for, register_image_model,
)
from mmspec.vision.pipeline import ARImagePipeline

KINDS = ["llamagen", "janus", "emu3", "chameleon"]
FAMILY = {"llamagen": LlamaGenImageModel, "janus": JanusImageModel, "emu3": Emu3ImageModel,
          "chameleon": ChameleonImageModel}
TINY_GPT = dict(dim=32, n_layer=1, n_head=4, multiple_of=8, num_classes=3, vocab_size=HF_CODES,
                block_size=HF_GRID * HF_GRID)


def tiny_vq():
    torch.manual_seed(0)
    return VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                   up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                   latent_channels=4, num_vq_embeddings=HF_CODES, vq_embed_dim=4, norm_num_groups=4,
                   sample_size=2 * HF_GRID).eval()


def components(kind):
    if kind == "llamagen":
        torch.manual_seed(0)
        return LlamaGenModel(**TINY_GPT).eval(), tiny_vq(), None
    if kind == "janus":
        return build_tiny_janus(), None, tiny_text_tokenizer(boi_token="<begin_of_image>")
    if kind == "emu3":
        return build_tiny_emu3(), None, tiny_text_tokenizer(boi_token="<|image start|>",
                                                            image_wrapper_token="<|image token|>")
    return build_tiny_chameleon(), tiny_vq(), tiny_text_tokenizer()


@pytest.fixture(scope="module")
def models():
    return {kind: image_model_for(*components(kind)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_each_family_reports_its_grid_codebook_and_adapter(models, kind):
    model = models[kind]
    model.validate()
    assert type(model) is FAMILY[kind] and model.name == kind
    assert model.class_conditional == (kind == "llamagen")
    assert model.num_classes == (3 if kind == "llamagen" else None)
    assert model.vq_scale_factor == 2 and model.num_codes == HF_CODES
    grid = model.code_grid(2 * HF_GRID, 2 * HF_GRID)
    assert grid == (HF_GRID, HF_GRID)
    if kind == "emu3":  # any size; the default is Emu3Processor's 90x90 codes
        assert model.grid_size == 90 and model.code_grid() == (90, 90) and model.code_grid(4, 6) == (2, 3)
    else:
        assert model.grid_size == HF_GRID and model.code_grid() == grid
    assert model.codebook().shape[0] == HF_CODES
    assert model.rows_in_parallel == (kind != "emu3")  # Emu3's end-of-line tokens follow raster order
    adapter = model.adapter(grid)
    assert adapter.vocab_size == model.num_codes
    ids = torch.tensor([[1, 2, 0]])
    if kind == "llamagen":  # class labels -> class tokens
        assert torch.equal(model.prompt_ids(ids), model.transformer.class_token(ids))
    else:  # LM ids -> the adapter's prompt ids
        assert torch.equal(model.prompt_ids(ids), adapter.prompt_ids(ids))


@pytest.mark.parametrize("kind", KINDS)
def test_decode_gives_unit_range_images_of_the_grid_size(models, kind):
    model = models[kind]
    grids = [(HF_GRID, HF_GRID)] + ([(2, 3)] if kind == "emu3" else [])
    for rows, cols in grids:
        codes = torch.randint(0, HF_CODES, (3, rows * cols), generator=torch.Generator().manual_seed(0))
        images = model.decode(codes, (rows, cols))
        assert images.shape == (3, 3, 2 * rows, 2 * cols) and images.dtype == torch.float32
        assert 0 <= images.min() and images.max() <= 1


def test_each_family_formats_prompts_and_unconditional_rows(models):
    grid = (HF_GRID, HF_GRID)
    labels = models["llamagen"]
    assert labels.check_conditioning([2, 0], None, None) == [2, 0]
    assert labels.prompt_rows([2, 0], grid) == [[2], [0]]
    assert labels.unconditional_rows([[2], [0]], grid) == [[3], [3]]  # the null class
    with pytest.raises(ValueError, match="class-conditional LlamaGenModel"):
        labels.tokenize_prompt("a", grid)

    janus = models["janus"].tokenize_prompt(["a b", "c"], grid)
    assert janus == [[1, 10, 11, JANUS_BOI], [1, 12, JANUS_BOI]]
    # Janus's own: everything but BOS and <begin_of_image> becomes the pad token
    assert models["janus"].unconditional_rows(janus, grid) == [[1, 0, 0, JANUS_BOI], [1, 0, JANUS_BOI]]

    emu3 = models["emu3"].tokenize_prompt(["c"], (2, 3))
    assert emu3 == [[1, 12, EMU3_BOI, 22, 34, 23, EMU3_WRAPPER]]  # "2*3" codes
    assert models["emu3"].unconditional_rows(emu3, (2, 3)) == [[EMU3_WRAPPER]]  # the last token alone

    chameleon = models["chameleon"].tokenize_prompt(["a b", "c"], grid)
    assert chameleon == [[1, 10, 11, CHAMELEON_BOI], [1, 12, CHAMELEON_BOI]]
    assert models["chameleon"].unconditional_rows(chameleon, grid) == [[1, CHAMELEON_BOI]] * 2  # empty prompt
    for kind in ("janus", "emu3", "chameleon"):
        assert models[kind].check_conditioning(None, "a", None) == ["a"]
        with pytest.raises(ValueError, match="class_labels is only for class-conditional models"):
            models[kind].check_conditioning([0], None, None)


def test_in_vocabulary_families_reject_image_tokens_in_prompts(models):
    model = models["chameleon"]
    image_id = sorted(model.image_token_ids())[0]
    with pytest.raises(ValueError, match=f"image-token ids \\[{image_id}\\]"):
        model.check_text_ids([[1, image_id]])
    with pytest.raises(ValueError, match="outside the model's text vocabulary"):
        model.check_text_ids([[1, 10_000]])


def test_an_unknown_transformer_class_names_the_supported_ones():
    with pytest.raises(TypeError) as info:
        image_model_for(tiny_llama(vocab_size=16, layers=1))
    message = str(info.value)
    assert "LlamaForCausalLM" in message
    for name in ("LlamaGenModel", "JanusForConditionalGeneration", "Emu3ForConditionalGeneration",
                 "ChameleonForConditionalGeneration"):
        assert name in message


def test_a_new_family_is_one_registered_class(monkeypatch):
    """A family for a subclass wins over its base's; the pipeline runs it through its one code path."""

    class WideGPT(LlamaGenModel):  # a LlamaGen variant whose family decodes inverted images
        pass

    class InvertedImageModel(LlamaGenImageModel):
        name = "inverted"
        transformer_class = WideGPT

        def decode(self, codes, grid):
            return 1 - super().decode(codes, grid)

    monkeypatch.setitem(IMAGE_MODELS, WideGPT, None)  # undone after the test
    assert register_image_model(InvertedImageModel) is InvertedImageModel
    assert issubclass(InvertedImageModel, ImageModel)
    gpt, vq, _ = components("llamagen")
    wide = WideGPT(**TINY_GPT).eval()
    wide.load_state_dict(gpt.state_dict())
    plain, inverted = ARImagePipeline(gpt, vq), ARImagePipeline(wide, vq)
    for pipe in (plain, inverted):
        pipe.set_progress_bar_config(disable=True)
    assert plain.model_kind == "llamagen" and inverted.model_kind == "inverted"
    a = plain(class_labels=[0, 2], generator=torch.Generator().manual_seed(0), output_type="pt")
    b = inverted(class_labels=[0, 2], generator=torch.Generator().manual_seed(0), output_type="pt")
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(b.images, 1 - a.images)


def test_decode_tokens_checks_the_code_shape(models):
    pipe = ARImagePipeline(*components("chameleon"))
    with pytest.raises(ValueError, match=r"codes must be \[N, rows\*cols\] = \[N, 16\] for a 4x4 grid"):
        pipe.decode_tokens(torch.zeros(1, HF_GRID, HF_GRID, dtype=torch.long))
