"""ARImagePipeline text-to-image on transformers' Janus, Emu3 and Chameleon (tiny random models, tokenizers
built in memory): prompt formatting, images for every output type, greedy codes equal to each model's own
generation (the references of test_hf_adapters), batch invariance, save/load, bad inputs."""

import importlib.util
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import VQModel
from tiny_models import (
    CHAMELEON_BOI, EMU3_BOI, EMU3_WRAPPER, HF_CODES, HF_GRID, JANUS_BOI, build_tiny_chameleon, build_tiny_emu3,
    build_tiny_janus, tiny_llama, tiny_text_tokenizer,
)

from mmspec.vision.hf_adapters import Emu3ImageAdapter
from mmspec.vision.llamagen import LlamaGenModel
from mmspec.vision.pipeline import ARImagePipeline
from mmspec.vision.tokenizer import decode_codes

# The adapter-level references (Janus: full-forward loop without guidance; Chameleon: full-forward loop),
# from the adapter tests.
_spec = importlib.util.spec_from_file_location("_hf_adapter_refs", Path(__file__).with_name("test_hf_adapters.py"))
refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refs)

# Sampling acceptance on the torch reference kernels (the Triton interpreter is slow on CPU; the kernels are
# model-independent and covered by tests/common and test_pipeline.py).
pytestmark = pytest.mark.usefixtures("torch_kernels")

KINDS = ["janus", "emu3", "chameleon"]
PROMPTS = ["a b", "c"]  # tiny tokenizer: a -> 10, b -> 11, c -> 12
SIDE = 2 * HF_GRID  # every tiny VQ decoder upsamples 2x: 4x4 codes -> 8x8 pixels
SIZE = {"emu3": dict(height=SIDE, width=SIDE)}  # Emu3 takes any size; the others have one


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def tiny_vq(codes=HF_CODES):
    """A diffusers VQModel with the tiny Chameleon codebook size (transformers has no Chameleon VQ decoder)."""
    torch.manual_seed(0)
    return VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                   up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                   latent_channels=4, num_vq_embeddings=codes, vq_embed_dim=4, norm_num_groups=4,
                   sample_size=SIDE).eval()


def build_pipe(kind):
    if kind == "janus":
        pipe = ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(boi_token="<begin_of_image>"))
    elif kind == "emu3":
        tokenizer = tiny_text_tokenizer(boi_token="<|image start|>", image_wrapper_token="<|image token|>")
        pipe = ARImagePipeline(build_tiny_emu3(), tokenizer=tokenizer)
    else:  # no boi_token attribute: the pipeline falls back to ChameleonProcessor's "<racm3:break>"
        pipe = ARImagePipeline(build_tiny_chameleon(), vqvae=tiny_vq(), tokenizer=tiny_text_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def pipes():
    return {kind: build_pipe(kind) for kind in KINDS}


def left_pad(rows):
    return refs.left_pad(rows)


# --- prompts and outputs -------------------------------------------------------------------------

def test_prompts_are_formatted_like_each_models_processor(pipes):
    assert pipes["janus"].tokenize_prompt(PROMPTS) == [[1, 10, 11, JANUS_BOI], [1, 12, JANUS_BOI]]
    emu3 = pipes["emu3"]
    # BOS text <|image start|> rows * cols <|image token|>, in codes: 4*4 (8x8 px), 2*3 (4x6 px)
    assert emu3.tokenize_prompt(PROMPTS, **SIZE["emu3"]) == [[1, 10, 11, EMU3_BOI, 24, 34, 24, EMU3_WRAPPER],
                                                             [1, 12, EMU3_BOI, 24, 34, 24, EMU3_WRAPPER]]
    assert emu3.tokenize_prompt("c", height=4, width=6) == [[1, 12, EMU3_BOI, 22, 34, 23, EMU3_WRAPPER]]
    assert pipes["chameleon"].tokenize_prompt(PROMPTS) == [[1, 10, 11, CHAMELEON_BOI], [1, 12, CHAMELEON_BOI]]
    for kind in KINDS:
        assert pipes[kind].code_grid(**SIZE.get(kind, {})) == (HF_GRID, HF_GRID)
        assert not pipes[kind].is_class_conditional and pipes[kind].num_classes is None


@pytest.mark.parametrize("kind", KINDS)
def test_images_of_every_output_type(pipes, kind):
    pipe, size = pipes[kind], SIZE.get(kind, {})
    steps = []
    out = pipe(prompt=PROMPTS, guidance_scale=2.0, num_images_per_prompt=2, generator=gens(range(4)), **size,
               callback_on_step_end=lambda p, i, t, kw: steps.append(i))
    assert len(out.images) == 4 and all(isinstance(im, PIL.Image.Image) for im in out.images)
    assert out.images[0].size == (SIDE, SIDE) and out.stats.tokens == 4 * HF_GRID ** 2
    assert out.tokens.shape == (4, HF_GRID ** 2) and 0 <= out.tokens.min() and out.tokens.max() < HF_CODES
    assert steps == list(range(HF_GRID ** 2))
    arr = pipe(prompt="a b", guidance_scale=2.0, generator=gens([0]), output_type="np", **size).images
    assert arr.shape == (1, SIDE, SIDE, 3) and arr.min() >= 0 and arr.max() <= 1
    pt = pipe(prompt="a b", guidance_scale=2.0, generator=gens([0]), output_type="pt", **size).images
    assert pt.shape == (1, 3, SIDE, SIDE) and pt.dtype == torch.float32
    assert np.allclose(pt.permute(0, 2, 3, 1).numpy(), arr)


def test_emu3_non_square_size(pipes):
    out = pipes["emu3"](prompt=PROMPTS, height=4, width=6, guidance_scale=2.0, generator=gens([0, 1]))
    assert out.images[0].size == (6, 4) and out.tokens.shape == (2, 6)


# --- greedy codes equal each model's own generation ----------------------------------------------

def test_janus_greedy_matches_its_image_generate(pipes):
    """With guidance: Janus's generate(generation_mode="image") (its own unconditional prompt); without:
    the full-forward reference. Images: Janus's decode_image_tokens."""
    pipe = pipes["janus"]
    model = pipe.transformer
    ids, mask = left_pad(pipe.tokenize_prompt(PROMPTS))
    expected = model.generate(ids, attention_mask=mask, generation_mode="image", do_sample=False, guidance_scale=3.0)
    out = pipe(prompt=PROMPTS, guidance_scale=3.0, temperature=0, output_type="pt")
    assert torch.equal(out.tokens, expected) and len(set(expected.flatten().tolist())) > 4
    with torch.no_grad():
        decoded = ((model.decode_image_tokens(expected).permute(0, 3, 1, 2) + 1) / 2).clamp(0, 1)
    assert torch.allclose(out.images, decoded, atol=1e-4)
    plain = pipe(prompt=PROMPTS, guidance_scale=1.0, temperature=0, output_type="pt")
    for b, row in enumerate(pipe.tokenize_prompt(PROMPTS)):
        assert torch.equal(plain.tokens[b], refs.janus_reference(model, torch.tensor([row]))[0])


def emu3_own_generate(model, ids, rows, cols, **kwargs):
    """Emu3's generate constrained as in its docs (visual tokens, EOL after every row), like test_hf_adapters'
    emu3_reference; returns the generated LM ids (rows x (cols + 1), EOLs included)."""
    adapter = Emu3ImageAdapter(model, width=cols)
    visual, eol, start = adapter.code_ids.tolist(), adapter.eol_token_id, ids.shape[1]
    allowed = lambda batch_id, seq: [eol] if (seq.shape[0] - start + 1) % (cols + 1) == 0 else visual  # noqa: E731
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=rows * (cols + 1), do_sample=False,
                         prefix_allowed_tokens_fn=allowed, pad_token_id=0, eos_token_id=None, **kwargs)
    seq = out[:, start:]
    grid = seq.view(-1, rows, cols + 1)
    assert bool((grid[..., -1] == eol).all())
    return adapter.lm_ids_to_codes(grid[..., :-1].reshape(seq.shape[0], -1)), seq


@pytest.mark.parametrize("case", ["plain", "cfg", "negative", "non_square"])
def test_emu3_greedy_matches_its_generate(pipes, case):
    """plain: no guidance; cfg: generate(guidance_scale=s) without a negative prompt (its unconditional
    branch is the prompt's last token); negative: generate(negative_prompt_ids=...) with the negative prompt
    formatted like the prompt. Images: Emu3's decode_image_tokens on its own output."""
    pipe = pipes["emu3"]
    model = pipe.transformer
    rows, cols = (2, 3) if case == "non_square" else (HF_GRID, HF_GRID)
    size = dict(height=2 * rows, width=2 * cols)
    scale = 3.0 if case in ("cfg", "negative") else 1.0
    negatives = ["d e", "f"] if case == "negative" else None
    out = pipe(prompt=PROMPTS, negative_prompt=negatives, guidance_scale=scale, temperature=0, output_type="pt",
               **size)
    for b, row in enumerate(pipe.tokenize_prompt(PROMPTS, **size)):
        kwargs = {} if scale == 1 else dict(guidance_scale=scale)
        if negatives is not None:
            neg = torch.tensor(pipe.tokenize_prompt(negatives[b], **size))
            kwargs.update(negative_prompt_ids=neg, negative_prompt_attention_mask=torch.ones_like(neg))
        codes, seq = emu3_own_generate(model, torch.tensor([row]), rows, cols, **kwargs)
        assert torch.equal(out.tokens[b], codes[0]) and len(set(codes.flatten().tolist())) > 3
        with torch.no_grad():  # decode_image_tokens drops the 3 tokens after the image (EOF, EOI, EOS)
            image = model.decode_image_tokens(image_tokens=torch.cat([seq, torch.zeros(1, 3, dtype=seq.dtype)], 1),
                                              height=rows, width=cols)
        assert torch.allclose(out.images[b], ((image[0] + 1) / 2).clamp(0, 1), atol=1e-4)  # batch 2 vs 1


def chameleon_cfg_reference(model, cond, uncond, scale, n=HF_GRID ** 2):
    """Full forward passes of conditional and unconditional sequences, argmax of u + s(c - u) over image tokens."""
    image_ids = torch.tensor(model.model.vocabulary_mapping.image_tokens)
    bpe2img = model.model.vocabulary_mapping.bpe2img
    seqs, codes = [torch.tensor([cond]), torch.tensor([uncond])], []
    with torch.no_grad():
        for _ in range(n):
            c, u = (model.lm_head(model.model(input_ids=s).last_hidden_state[:, -1])[:, image_ids] for s in seqs)
            best = image_ids[(u + scale * (c - u)).argmax(-1)]
            codes.append(bpe2img[int(best)])
            seqs = [torch.cat([s, best[:, None]], 1) for s in seqs]
    return torch.tensor(codes)


def test_chameleon_greedy_matches_full_forward_reference(pipes):
    """Without guidance: test_hf_adapters' reference loop; with guidance: the same loop on [cond; uncond] with
    Meta's unconditional prompt [BOS, <racm3:break>]. Images: the given vqvae."""
    pipe = pipes["chameleon"]
    model = pipe.transformer
    plain = pipe(prompt=PROMPTS, guidance_scale=1.0, temperature=0, output_type="pt")
    cfg = pipe(prompt=PROMPTS, guidance_scale=3.0, temperature=0, output_type="pt")
    for b, row in enumerate(pipe.tokenize_prompt(PROMPTS)):
        expected = refs.chameleon_reference(model, torch.tensor([row]))[0]
        assert torch.equal(plain.tokens[b], expected)
        assert torch.equal(cfg.tokens[b], chameleon_cfg_reference(model, row, [1, CHAMELEON_BOI], 3.0))
    with torch.no_grad():
        decoded = (decode_codes(pipe.vqvae, cfg.tokens.view(-1, HF_GRID, HF_GRID)) + 1) / 2
    assert torch.allclose(cfg.images, decoded, atol=1e-4)
    assert len(set(plain.tokens.flatten().tolist())) > 4 and not torch.equal(plain.tokens, cfg.tokens)


# --- sampling: batch invariance, save / load ----------------------------------------------------

@pytest.mark.parametrize("negative", [None, ["d e", "f"]])
@pytest.mark.parametrize("kind", KINDS)
def test_batch_of_two_equals_two_batches_of_one(pipes, kind, negative):
    pipe, size = pipes[kind], SIZE.get(kind, {})
    batched = pipe(prompt=PROMPTS, negative_prompt=negative, guidance_scale=2.0, generator=gens([5, 6]),
                   output_type="pt", **size)
    for b, seed in enumerate([5, 6]):
        single = pipe(prompt=PROMPTS[b], negative_prompt=None if negative is None else negative[b],
                      guidance_scale=2.0, generator=gens([seed]), output_type="pt", **size)
        assert torch.equal(single.tokens[0], batched.tokens[b])
        assert torch.allclose(single.images[0], batched.images[b], atol=1e-4)


def test_num_images_per_prompt_repeats_prompts(pipes):
    pipe = pipes["janus"]
    repeated = pipe(prompt="a b", num_images_per_prompt=2, generator=gens([3, 4]), output_type="pt")
    listed = pipe(prompt=["a b", "a b"], generator=gens([3, 4]), output_type="pt")
    assert torch.equal(repeated.tokens, listed.tokens) and not torch.equal(listed.tokens[0], listed.tokens[1])


def test_bench_generate_takes_prompts(pipes):
    pipe = pipes["chameleon"]
    one, stats = pipe.bench_generate(PROMPTS * 2, 1, 0, {"guidance_scale": 2.0})
    two, _ = pipe.bench_generate(PROMPTS * 2, 2, 0, {"guidance_scale": 2.0})
    assert one == two and stats.tokens == 4 * HF_GRID ** 2


@pytest.mark.parametrize("kind", KINDS)
def test_bench_inputs_and_quality_of_a_text_to_image_model(pipes, kind, monkeypatch):
    """Without prompts, text-to-image models run on the built-in captions; quality is the target's NLL of the
    codes: greedy codes (each the argmax after its prefix) score lower than sampled ones, and those lower than
    uniformly random codes (an off-by-one in the alignment of logits and codes breaks both orders)."""
    from mmspec.vision.prompts import BENCH_PROMPTS

    pipe = pipes[kind]  # at the model's default size, as bench runs it
    if kind == "emu3":  # Emu3's default is 90x90 codes (8 100 steps an image): the tiny model's default is 4x4
        assert pipe.code_grid() == (90, 90)
        monkeypatch.setattr(type(pipe.image_model), "default_grid", HF_GRID)  # built per access: patch its class
    assert pipe.code_grid() == (HF_GRID, HF_GRID)
    inputs = pipe.bench_inputs(6, seed=0)
    assert inputs == list(BENCH_PROMPTS[:6])
    greedy, _ = pipe.bench_generate(inputs, 3, 0, {"guidance_scale": 1.0, "temperature": 0.0})
    sampled, _ = pipe.bench_generate(inputs, 3, 0, {"guidance_scale": 1.0, "temperature": 1.0})
    uniform = torch.randint(0, HF_CODES, (6, len(greedy[0])), generator=torch.Generator().manual_seed(0)).tolist()
    nll = {name: pipe.bench_quality(inputs, codes)["nll"] for name, codes in
           (("greedy", greedy), ("sampled", sampled), ("uniform", uniform))}
    assert nll["greedy"] < nll["sampled"] < nll["uniform"], nll


def test_self_distillation_sequences(pipes):
    pipe = pipes["janus"]
    target, ids, mask, first = pipe.self_distillation_sequences(12, seed=3, unconditional_fraction=0.5)
    again = pipe.self_distillation_sequences(12, seed=3, unconditional_fraction=0.5)
    assert torch.equal(ids, again[1]) and torch.equal(mask, again[2]) and torch.equal(first, again[3])
    codes = HF_GRID ** 2
    assert ids.shape == mask.shape and ids.shape[0] == 12 and bool(mask[:, -codes:].all())
    assert torch.equal(first, mask[:, :-codes].sum(1))  # codes start right after each row's real prompt tokens
    assert len(set(first.tolist())) > 1  # conditional and unconditional prompts differ in length
    assert int(ids[:, -codes:].max()) < target.vocab_size


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(pipes, kind, tmp_path):
    """transformers models and tokenizers are ordinary diffusers pipeline components (library "transformers")."""
    pipe, size = pipes[kind], SIZE.get(kind, {})
    pipe.save_pretrained(tmp_path / "p")
    loaded = ARImagePipeline.from_pretrained(tmp_path / "p")
    loaded.set_progress_bar_config(disable=True)
    assert type(loaded.transformer) is type(pipe.transformer) and loaded.model_kind == kind
    assert (loaded.vqvae is None) == (kind != "chameleon")
    assert loaded.tokenize_prompt(PROMPTS, **size) == pipe.tokenize_prompt(PROMPTS, **size)
    a = pipe(prompt=PROMPTS, guidance_scale=2.0, generator=gens([1, 2]), output_type="pt", **size)
    b = loaded(prompt=PROMPTS, guidance_scale=2.0, generator=gens([1, 2]), output_type="pt", **size)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.images, b.images)


# --- bad inputs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, kwargs, match", [
    ("janus", dict(prompt="a", class_labels=[0]), "exactly one of class_labels and prompt"),
    ("janus", dict(), "prompt is required"),
    ("emu3", dict(class_labels=[0]), "class_labels is only for class-conditional models"),
    ("chameleon", dict(class_labels=1), "class_labels is only for class-conditional models"),
    ("janus", dict(prompt=[]), "non-empty list of strings"),
    ("janus", dict(prompt=[1]), "non-empty list of strings"),
    ("chameleon", dict(prompt="a", negative_prompt="b", guidance_scale=1.0), r"guidance_scale > 1"),
    ("chameleon", dict(prompt=["a", "b"], negative_prompt=["c", "d", "e"]), "one per prompt"),
    ("janus", dict(prompt="a", height=16), "generates 8x8 images only"),
    ("emu3", dict(prompt="a", height=7, width=8), "multiple of 2 pixels"),
    ("emu3", dict(prompt="a", guidance_scale=0.5), "guidance_scale must be >= 1"),
    ("chameleon", dict(prompt=["a", "b"], generator=[torch.Generator()]), "generator"),
    ("janus", dict(prompt="a", output_type="jpeg"), "output_type must be one of"),
])
def test_bad_inputs(pipes, kind, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pipes[kind](**kwargs)


def test_prompt_needs_a_text_to_image_model_and_a_tokenizer(pipes):
    torch.manual_seed(0)
    gpt = LlamaGenModel(dim=32, n_layer=1, n_head=4, multiple_of=8, num_classes=3, vocab_size=HF_CODES,
                        block_size=16).eval()
    llamagen = ARImagePipeline(gpt, tiny_vq())
    for kwargs in (dict(prompt="a"), dict(class_labels=0, negative_prompt="a")):
        with pytest.raises(ValueError, match="prompt needs a text-to-image model and a tokenizer"):
            llamagen(**kwargs)
    with pytest.raises(ValueError, match="exactly one of class_labels and prompt"):
        llamagen(class_labels=0, prompt="a")
    with pytest.raises(ValueError, match="class_labels is required"):
        llamagen()
    no_tokenizer = ARImagePipeline(pipes["janus"].transformer)
    with pytest.raises(ValueError, match="prompt needs a text-to-image model and a tokenizer"):
        no_tokenizer(prompt="a")


def test_bad_components(pipes):
    with pytest.raises(ValueError, match="vqvae is required"):
        ARImagePipeline(pipes["chameleon"].transformer, tokenizer=pipes["chameleon"].tokenizer)
    with pytest.raises(ValueError, match="vqvae has 16 codes"):
        ARImagePipeline(pipes["chameleon"].transformer, vqvae=tiny_vq(codes=16))
    with pytest.raises(ValueError, match="vqvae must be None"):
        ARImagePipeline(pipes["janus"].transformer, vqvae=tiny_vq())
    with pytest.raises(TypeError, match="supported image model classes: LlamaGenModel, JanusForConditionalGeneration"):
        ARImagePipeline(tiny_llama(vocab_size=16, layers=1), vqvae=tiny_vq())
