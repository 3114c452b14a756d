"""At most one host synchronisation per decode step.

A GPU decode loop that reads a tensor back (`.item()`, `.tolist()`, `bool(t)`, a boolean mask) makes the
CPU wait for every queued kernel; one such read per row or per tree level leaves the GPU idle between
launches. `count_host_syncs` counts those reads on any device, so this CPU test bounds them: the decode
loop's one read per step (finished rows, the longest accepted run, what rows still need), plus a constant
per call (prefill, the final statistics) and the KV-cache tidy, at most every 16 rollbacks (about eight
steps) and only once a cache has grown by twice `compact_slack` slots.
"""

import pytest
import torch
from tiny_models import perturbed_copy, tiny_llama

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.host_sync import count_host_syncs
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.tree import TreeSpec

PER_CALL = 10  # prefill, left-aligning prompts, the first cache tidy, settling statistics, the rows' totals
# and, per row, the step it finishes on (which rows leave is data-dependent: their indices are read back)


def test_the_counter_sees_each_kind_of_host_read():
    t = torch.arange(6)
    with count_host_syncs() as count:
        t.sum().item()
        t.tolist()
        bool(t.any())
        int(t.max())
        t[t > 2]
        t[t > 4] = 0
        t.nonzero()
        torch.nonzero(t)
        t.cpu()
        t[1:3] + t[torch.tensor([0, 1])]  # slicing and integer-tensor indexing stay on the device
    assert count.total == 9


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tree", [None, "2,2,1", "dynamic"])
def test_speculative_loop_reads_the_device_once_per_step(temperature, tree):
    target = tiny_llama()
    spec = TreeSpec.full([int(b) for b in tree.split(",")]) if tree and tree != "dynamic" else None
    dynamic = (4, 3, 9) if tree == "dynamic" else None
    decoder = SpeculativeDecoder(HFCausalLM(target, compact_slack=10 ** 6),
                                 DraftModelDrafter(HFCausalLM(perturbed_copy(target, 0.05), compact_slack=10 ** 6),
                                                   tree=spec, dynamic=dynamic),
                                 logits=LogitsPipeline(temperature=temperature),
                                 num_draft_tokens=4 if tree is None else 0, eos_token_id=5, pad_token_id=5)
    ids = torch.randint(1, 64, (3, 6), generator=torch.Generator().manual_seed(1))
    with count_host_syncs(where=True) as count:
        out = decoder.generate(ids, max_new_tokens=64, generator=torch.Generator().manual_seed(0))
    steps = out.stats.target_nfe
    assert steps > 10 and out.stats.mean_accepted > 1
    assert count.total <= steps + PER_CALL + ids.shape[0], count.by_call.most_common(5)


@pytest.mark.parametrize("tree", [{}, {"tree_branching": "4,2,1,1"}, {"tree_depth": 4}], ids=["chain", "static", "dynamic"])
def test_image_pipeline_step_reads_stay_near_one(tree):
    """Through the bundled image pipeline (CFG, the EAGLE head) with default cache slack: one read per step
    and the tidy of two caches every `compact_slack` slots (the progress bar: see the next test)."""
    from mmspec import load_plugin

    pipe = load_plugin("eagle", **tree)
    pipe.set_progress_bar_config(disable=True)
    call = dict(class_labels=[3, 5], guidance_scale=3.0, temperature=1.0, output_type="pt")
    pipe(**call, generator=torch.Generator().manual_seed(0))  # warm-up
    with count_host_syncs(where=True) as count:
        out = pipe(**call, generator=torch.Generator().manual_seed(0))
    steps = out.stats.target_nfe
    caches = 2  # the target's and the EAGLE head's, each tidied at most every eight steps
    assert count.total <= steps + caches * (steps // 8 + 1) + PER_CALL + 2, count.by_call.most_common(5)


def test_progress_bar_reads_counts_only_when_it_redraws():
    from mmspec.common.pipeline import TokenProgress

    class Bar:
        disable, n = False, 0

        def update(self, k):
            self.n += k

    bar = Bar()
    progress = TokenProgress(bar, interval=float("inf"))
    with count_host_syncs() as count:
        for _ in range(50):
            progress.add(torch.tensor([1, 0, 3]))
    assert count.total == 0 and bar.n == 0
    progress.close()
    assert bar.n == 50 * 7
    progress.interval = 0.0  # every step redraws: one read each
    with count_host_syncs() as count:
        for _ in range(5):
            progress.add(torch.tensor([0]))
    assert count.total == 5 and bar.n == 50 * 7 + 5
