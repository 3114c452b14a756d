"""`zipar`: the schedule and its forward count, attention against a brute-force reference (every query
sees exactly the tokens generated before it at lower positions), window = W equals AR, batches, CFG,
the Janus adapter, bad inputs."""

import pytest
import torch
from law import class_grid_law, gof_pvalue, sequence_codes
from request_helpers import build_decoder
from tiny_models import build_tiny_emu3, build_tiny_janus, tiny_text_tokenizer

from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.common.registry import get_plugin_class
from mmspec.common.schedule import Schedule, ScheduledDecoder, ScheduleStep
from mmspec.plugins.zipar import next_set_schedule, num_next_set_forwards
from mmspec.vision.llamagen import LlamaGenAdapter, LlamaGenModel
from mmspec.vision.pipeline import ARImagePipeline

pytestmark = pytest.mark.usefixtures("torch_kernels_module")

GRID = 4


@pytest.fixture(scope="module")
def tiny_gen():
    torch.manual_seed(0)
    model = LlamaGenModel(dim=32, n_layer=2, n_head=2, num_classes=3, vocab_size=16, block_size=GRID * GRID,
                          token_dropout_p=0.0, resid_dropout_p=0.0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("height,width,window", [(16, 16, 1), (16, 16, 4), (16, 16, 8), (16, 16, 16), (3, 7, 2),
                                                 (5, 4, 3), (1, 6, 2)])
def test_schedule_forward_count_matches_the_formula(height, width, window):
    schedule = next_set_schedule(height, width, window)
    assert len(schedule.steps) == num_next_set_forwards(height, width, window)
    # every token's input is its raster predecessor: the true token, or a placeholder at a row start
    for step in schedule.steps:
        for slot, index in zip(step.sample_from, step.sample_index):
            assert step.feed[slot] == index - 1


def reference_decode(model, label, window, guidance=None):
    """Greedy next-set decoding by full recomputation: at step t the input at position P sees the prompt, the
    tokens generated in steps < t at positions < P, and itself (a generated token or a placeholder)."""
    schedule = next_set_schedule(GRID, GRID, window)
    out, born = {}, {}
    cls = model.class_token(torch.tensor([label]))
    null = model.class_token(torch.tensor([model.null_class]))
    for t, step in enumerate(schedule.steps):
        for slot, index in zip(step.sample_from, step.sample_index):
            pos = step.feed[slot]
            context = sorted(i for i in out if i < pos and born[i] < t)
            own = out[step.source[slot]] if step.source[slot] >= 0 else None  # the input itself
            tokens = [out[i] for i in context] + ([own] if own is not None else [])
            idx = context + ([pos] if own is not None else [])
            ids = torch.tensor([tokens], dtype=torch.long)
            positions = torch.tensor([[0] + [1 + i for i in idx]])
            with torch.no_grad():
                cond = model(torch.cat([cls[:, None], ids], 1), positions)[:, -1]
                logits = cond
                if guidance is not None:
                    uncond = model(torch.cat([null[:, None], ids], 1), positions)[:, -1]
                    logits = uncond + guidance * (cond - uncond)
            out[index] = int(logits.argmax())
            born[index] = t
    return [out[i] for i in range(GRID * GRID)]


@pytest.mark.parametrize("window,guidance", [(1, None), (2, 2.5), (3, None), (GRID, 2.5)])
def test_attention_matches_a_full_recomputation(tiny_gen, window, guidance):
    labels = torch.tensor([0, 2])
    target, prefill = LlamaGenAdapter(tiny_gen), None
    cond = tiny_gen.class_token(labels)[:, None]
    if guidance is not None:
        uncond = tiny_gen.class_token(torch.full_like(labels, tiny_gen.null_class))[:, None]
        target, prefill = CFGModel(target, guidance), (torch.cat([cond, uncond]), None)
    decoder = ScheduledDecoder(target, next_set_schedule(GRID, GRID, window), LogitsPipeline(temperature=0))
    out = decoder.generate(cond, max_new_tokens=GRID * GRID, prefill_input=prefill)
    for row, label in enumerate(labels.tolist()):
        assert out.sequences[row].tolist() == reference_decode(tiny_gen, label, window, guidance)
    assert out.stats.target_nfe == num_next_set_forwards(GRID, GRID, window)


def test_window_equal_to_width_is_plain_ar(tiny_gen):
    cond = tiny_gen.class_token(torch.tensor([1, 2, 0]))[:, None]
    ar = build_decoder(get_plugin_class("ar")(), LlamaGenAdapter(tiny_gen), LogitsPipeline(temperature=0))
    zip_full = build_decoder(get_plugin_class("zipar")(window=GRID), LlamaGenAdapter(tiny_gen),
                             LogitsPipeline(temperature=0), grid=(GRID, GRID))
    a = ar.generate(cond, max_new_tokens=GRID * GRID)
    z = zip_full.generate(cond, max_new_tokens=GRID * GRID)
    assert torch.equal(a.sequences, z.sequences)
    zip_fast = build_decoder(get_plugin_class("zipar")(window=1), LlamaGenAdapter(tiny_gen),
                             LogitsPipeline(temperature=0), grid=(GRID, GRID))
    assert not torch.equal(zip_fast.generate(cond, max_new_tokens=GRID * GRID).sequences, a.sequences)


def test_sampling_rows_do_not_depend_on_their_batch(tiny_gen):
    decoder = ScheduledDecoder(LlamaGenAdapter(tiny_gen), next_set_schedule(GRID, GRID, 2),
                               LogitsPipeline(temperature=1.0, top_k=8))
    cond = tiny_gen.class_token(torch.tensor([0, 1, 2]))[:, None]
    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    batch = decoder.generate(cond, max_new_tokens=GRID * GRID, generator=gens([4, 5, 6]))
    alone = decoder.generate(cond[1:2], max_new_tokens=GRID * GRID, generator=gens([5]))
    assert torch.equal(batch.sequences[1], alone.sequences[0])
    again = decoder.generate(cond, max_new_tokens=GRID * GRID, generator=gens([4, 5, 6]))
    assert torch.equal(batch.sequences, again.sequences)


@pytest.fixture(scope="module")
def janus_pipe():
    pipe = ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(boi_token="<begin_of_image>"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_zipar_on_janus_with_guidance(janus_pipe):
    ar = janus_pipe(prompt=["a b", "c"], guidance_scale=2.0, temperature=0, output_type="pt")
    full_pipe = get_plugin_class("zipar")(window=janus_pipe.grid_size).attach(janus_pipe)
    full = full_pipe(prompt=["a b", "c"], guidance_scale=2.0, temperature=0, output_type="pt")
    assert torch.equal(full.tokens, ar.tokens)
    fast_pipe = get_plugin_class("zipar")(window=1).attach(janus_pipe)
    fast = fast_pipe(prompt=["a b", "c"], guidance_scale=2.0, generator=torch.Generator().manual_seed(0),
                     output_type="pt")
    grid = janus_pipe.grid_size
    assert fast.stats.target_nfe == num_next_set_forwards(grid, grid, 1) < grid * grid
    assert fast.images.shape[0] == 2
    assert janus_pipe.plugin is None  # attaching made new pipelines


def test_bad_inputs(tiny_gen):
    plugin_cls = get_plugin_class("zipar")
    with pytest.raises(ValueError, match="window"):
        plugin_cls(window=0)
    with pytest.raises(ValueError, match="grid width"):
        build_decoder(plugin_cls(window=GRID + 1), LlamaGenAdapter(tiny_gen), LogitsPipeline(), grid=(GRID, GRID))
    decoder = ScheduledDecoder(LlamaGenAdapter(tiny_gen), next_set_schedule(GRID, GRID, 2))
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(torch.tensor([[16]]), max_new_tokens=5)
    broken = Schedule(num_tokens=2, steps=[ScheduleStep([-1], [-1], [False], [0], [1])])
    with pytest.raises(ValueError, match="samples 1 of 2"):
        broken.check()
    emu3 = ARImagePipeline(build_tiny_emu3(), tokenizer=tiny_text_tokenizer(
        boi_token="<|image start|>", image_wrapper_token="<|image token|>"))
    emu3.set_progress_bar_config(disable=True)
    with pytest.raises(ValueError, match="raster order \\(e.g. Emu3"):  # refused at load time
        plugin_cls(window=1).attach(emu3)
    with pytest.raises(ValueError, match="window must be between 1 and the grid width \\(4\\), got 8"):
        plugin_cls().attach(ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(
            boi_token="<begin_of_image>")))


# --------------------------------------------------------------------------
# Verified mode: lossless
# --------------------------------------------------------------------------

@pytest.mark.parametrize("window,guidance", [(1, 2.5), (2, None), (3, 2.5)])
def test_verified_greedy_equals_ar(tiny_gen, window, guidance):
    labels = torch.tensor([0, 2, 1])
    cond = tiny_gen.class_token(labels)[:, None]
    target, prefill = LlamaGenAdapter(tiny_gen), None
    if guidance is not None:
        uncond = tiny_gen.class_token(torch.full_like(labels, tiny_gen.null_class))[:, None]
        target, prefill = CFGModel(target, guidance), (torch.cat([cond, uncond]), None)
    greedy = LogitsPipeline(temperature=0)
    ar = build_decoder(get_plugin_class("ar")(), target, greedy).generate(
        cond, max_new_tokens=GRID * GRID, prefill_input=prefill)
    verified = build_decoder(get_plugin_class("zipar")(window=window, mode="verified"), target, greedy,
                             grid=(GRID, GRID)).generate(cond, max_new_tokens=GRID * GRID, prefill_input=prefill)
    assert torch.equal(verified.sequences, ar.sequences)
    assert verified.stats.target_nfe <= GRID * GRID


LAW_H, LAW_W, LAW_VOCAB, LAW_SAMPLES = 2, 3, 3, 20_000


@pytest.fixture(scope="module")
def law_model():
    torch.manual_seed(3)
    model = LlamaGenModel(dim=16, n_layer=1, n_head=1, num_classes=2, vocab_size=LAW_VOCAB, block_size=9,
                          token_dropout_p=0.0, resid_dropout_p=0.0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.8)
    return model


def law_counts(model, decoder, label):
    cond = model.class_token(torch.full((LAW_SAMPLES, 1), label))
    out = decoder.generate(cond, max_new_tokens=LAW_H * LAW_W, generator=torch.Generator().manual_seed(0))
    return torch.bincount(sequence_codes(out.sequences, LAW_VOCAB), minlength=LAW_VOCAB ** (LAW_H * LAW_W))


def test_verified_sampling_follows_the_ar_law_and_lossy_does_not(law_model):
    window = 1  # row 1 starts after one token: placeholders, drafts ahead and re-verification all happen
    from mmspec.plugins.zipar.verified import VerifiedNextSetDecoder

    logits = LogitsPipeline(temperature=1.0)
    law = class_grid_law(law_model, 1, LAW_H * LAW_W)
    verified = VerifiedNextSetDecoder(LlamaGenAdapter(law_model), LAW_H, LAW_W, window, logits)
    assert gof_pvalue(law_counts(law_model, verified, 1), law) > 1e-3
    lossy = ScheduledDecoder(LlamaGenAdapter(law_model), next_set_schedule(LAW_H, LAW_W, window), logits)
    assert gof_pvalue(law_counts(law_model, lossy, 1), law) < 1e-6
