"""`ptp`: parallel-token prediction with learnable register tokens (after PTP, arXiv:2603.15206).

One target forward per step both verifies the previous step's k drafts and proposes the next k. The forward
carries a tree: the root (the newest token), the chain of k drafts, and after every chain node i (0..k) a
group of k registers (`registers.py`). Register j of group i sits at position p+i+j and predicts the token
j steps beyond the one after chain node i. Registers see the prefix up to their chain node and the earlier
registers of their group; chain tokens never see registers. So the chain's logits are exactly the model's
own, and verification against them (greedy match, or speculative sampling with the registers'
distributions as q) keeps the output equal to plain AR's: greedy token for token, sampling in law. Whatever
the step accepts (n drafts), group n was conditioned on exactly the accepted prefix, so its registers are the
next drafts, from the same forward: no draft pass of its own.

The cost is the forward's width: 1 + k + k(k+1) tokens per row. Between steps, group n's tokens leave
the cache with the rejected drafts (`keep` on the accepted path).

PTP's exact insertion scheme and loss are unpublished. This is the mask-token reading in
`../shared/specs/speech_docs.md` §5: registers after every position, a group-causal mask, and a loss over
registers only. The base model stays frozen, so the next-token term is a constant and is dropped. The
registers and their position-gated adapters are trained by `examples/train_ptp.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from mmspec.common.accept import Draft, GreedyMatch, SpeculativeSampling
from mmspec.common.bench_run import cut_after, run_peer
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import Drafter, StepContext
from mmspec.common.heads import load_head
from mmspec.common.kernels import sample_inverse_cdf
from mmspec.common.logits import draw_uniform
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.tree import TreeSpec
from mmspec.docs_parse.pipeline import load_page
from mmspec.docs_parse.structure import PageRegions

from .config import PTPConfig
from .kernels import node_table, verify_inputs
from .registers import RegisterSet, inject

_BENCH_ROWS = {"batch_size": 4, "num_samples": 48}  # the 48 held-out pages, 4 at a time
BUNDLED_REGISTERS = Path(__file__).resolve().parent / "bundled" / "doc_tiny_registers"


@dataclass
class RegisterTree:
    """The static tree of one step for k drafts: node ids of the chain and of each register group."""

    spec: TreeSpec
    chain: torch.Tensor  # [L] node of draft d (1..L, the chain width)
    root_and_chain: torch.Tensor  # [L+1] node 0, then the chain: the nodes whose logits verify
    groups: torch.Tensor  # [k+1, k] node of register j of the group after chain node i (0 = the root)
    group_of: torch.Tensor  # [N+1] chain index i a register node belongs to, -1 for the root and the chain
    register_index: torch.Tensor  # [N+1] j-1 for register nodes, -1 otherwise
    table: torch.Tensor | None = None  # [4, N+1] the verify-input kernel's node table (kernels.node_table)


@lru_cache(maxsize=16)
def register_tree(k: int, chain_length: int | None = None) -> RegisterTree:
    """The step's tree: a chain of `chain_length` drafts (k by default; longer for copy drafts) and a group of
    k registers after chain nodes 0..k only, so a long chain costs one token per extra draft."""
    chain_length = k if chain_length is None else chain_length
    if chain_length < k:
        raise ValueError(f"chain_length must be >= k ({k}), got {chain_length}")
    chain_paths = [(0,) * d for d in range(1, chain_length + 1)]
    group_paths = [[(0,) * i + (1,) + (0,) * (j - 1) for j in range(1, k + 1)] for i in range(k + 1)]
    spec = TreeSpec.from_paths(chain_paths + [p for g in group_paths for p in g])
    node = {p: n + 1 for n, p in enumerate(spec.paths)}
    chain = torch.tensor([node[p] for p in chain_paths])
    groups = torch.tensor([[node[p] for p in g] for g in group_paths])
    group_of = torch.full((spec.num_nodes + 1,), -1, dtype=torch.long)
    register_index = torch.full_like(group_of, -1)
    for i in range(k + 1):
        group_of[groups[i]] = i
        register_index[groups[i]] = torch.arange(k)
    root_and_chain = torch.cat([torch.zeros(1, dtype=torch.long), chain])
    tree = RegisterTree(spec, chain, root_and_chain, groups, group_of, register_index)
    tree.table = node_table(tree)
    return tree


def copy_candidate(history: list[int], match: int, limit: int) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of `history`'s last `match` tokens (at most
    `limit`), or []. In a table the previous row's tag skeleton is such a continuation."""
    if limit < 1 or len(history) <= match:
        return []
    tail = history[-match:]
    for start in range(len(history) - match - 1, -1, -1):
        if history[start:start + match] == tail:
            return history[start + match:start + match + limit]
    return []


class RegisterDrafter(Drafter):
    """Holds the drafts the last verify pass's registers proposed; the first step has none.

    With `copy_length` > 0 a row whose recent tokens occurred before drafts a copy of what followed them
    (up to `copy_length` tokens) when that is longer than its register drafts; copies are deterministic
    proposals (q one-hot), verified like any draft."""

    def __init__(self, k: int, vocab_size: int, copy_length: int = 0, copy_match: int = 3):
        self.k = k
        self.vocab_size = vocab_size
        self.copy_length, self.copy_match = copy_length, copy_match
        self.width = max(k, copy_length)  # the chain the verify pass carries
        self.tree = None  # a chain drafter as far as the loop is concerned; the register tree is the decoder's
        self.tokens = self.probs = self.lengths = None
        self.history: list[list[int]] = []

    def begin(self, input_ids, attention_mask):
        batch = input_ids.shape[0]
        self.tokens = torch.zeros(batch, self.width, dtype=torch.long, device=input_ids.device)
        self.probs = None
        self.lengths = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        self.history = [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), mask.cpu())] \
            if self.copy_length else []

    def propose(self, ctx: StepContext) -> Draft:
        probs = self.probs
        if probs is None and not ctx.logits.greedy:  # first step: nothing drafted (lengths 0), q is never read
            probs = torch.full((*self.tokens.shape, self.vocab_size), 1.0 / self.vocab_size, device=self.tokens.device)
        return Draft(tokens=self.tokens, probs=probs, lengths=self.lengths, forwards=0)

    def commit(self, ctx, acceptance, target_probs=None, output=None):
        tree = register_tree(self.k, self.width)
        num = acceptance.num_accepted
        has_group = num <= self.k  # a copy accepted past node k has no register group after it
        groups = tree.groups.to(output.logits.device)[num.clamp(max=self.k)]  # [B, k]: the accepted group
        rows = torch.arange(groups.shape[0], device=groups.device)[:, None]
        q = ctx.logits.probs(output.logits[rows, groups])  # [B, k, V]
        batch = q.shape[0]
        if ctx.logits.greedy:
            tokens, probs = q.argmax(-1), None
        else:
            tokens, probs = sample_inverse_cdf(q, draw_uniform(ctx.generator, batch, self.k, q.device)), q
        left = ctx.remaining - (num + 1)  # tokens still to produce after this step
        lengths = torch.where(has_group, (left - 1).clamp(0, self.k), 0)  # the next step yields up to lengths + 1
        pad = self.width - self.k
        self.tokens = torch.nn.functional.pad(tokens, (0, pad))
        self.probs = None if probs is None else torch.nn.functional.pad(probs, (0, 0, 0, pad))
        self.lengths = lengths
        if self.copy_length:
            self._offer_copies(ctx, acceptance, left)

    def _offer_copies(self, ctx, acceptance, left) -> None:
        """Rows whose history offers a copy longer than their register drafts draft the copy instead.

        A row's history holds every token before its newest: `begin` gives the prompt without its last token,
        and each step adds the token it fed (ctx.last_tokens) and the drafts it accepted. The extra token of
        this step is the next newest, so the lookup runs on history + [extra]."""
        last, accepted = ctx.last_tokens.tolist(), acceptance.num_accepted.tolist()
        for b, n in enumerate(accepted):
            self.history[b] += [last[b]] + acceptance.tokens[b, :n].tolist()
            newest = int(acceptance.tokens[b, n])
            room = int(left[b]) - 1
            copy = copy_candidate(self.history[b] + [newest], self.copy_match, min(self.copy_length, room))
            if len(copy) > int(self.lengths[b]):
                self.tokens[b] = 0
                self.tokens[b, :len(copy)] = torch.tensor(copy, device=self.tokens.device)
                self.lengths[b] = len(copy)
                if self.probs is not None:  # a deterministic proposal: q is one-hot on the copied token
                    self.probs[b] = 0.0
                    self.probs[b, torch.arange(len(copy)), self.tokens[b, :len(copy)]] = 1.0

    def admit(self, input_ids, attention_mask, ctx):
        """New rows have no drafts yet (their first step verifies nothing), as in `begin`."""
        new = input_ids.shape[0]
        self.tokens = torch.cat([self.tokens, self.tokens.new_zeros(new, self.width)])
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(new)])
        if self.probs is not None:  # q of a row without drafts is never read
            self.probs = torch.cat([self.probs, self.probs.new_full((new, *self.probs.shape[1:]),
                                                                    1.0 / self.vocab_size)])
        if self.copy_length:
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            self.history += [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), mask.cpu())]

    def select_rows(self, rows):
        self.tokens, self.lengths = self.tokens[rows], self.lengths[rows]
        self.probs = None if self.probs is None else self.probs[rows]
        if self.history:
            self.history = [self.history[i] for i in rows.tolist()]


class PTPDecoder(SpeculativeDecoder):
    """The core's draft/verify loop with registers riding along the verify pass (see the module docstring)."""

    def __init__(self, target, registers: RegisterSet, logits, k: int, eos_token_id=None, pad_token_id=-1,
                 position_budget: int | None = None, copy_length: int = 0):
        registers.register_ids(k)  # k within what was trained
        rule = GreedyMatch() if logits.greedy else SpeculativeSampling()
        drafter = RegisterDrafter(k, target.vocab_size, copy_length)
        super().__init__(target, drafter, rule, logits, num_draft_tokens=drafter.width,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        self.width = drafter.width
        self.registers = registers.to(target.device)
        self.k = k
        self.position_budget = position_budget
        embedding = target.input_embedding_module()
        registers.check_model(embedding, target.vocab_size, target.model, "plugin 'ptp'")
        self._embedding = embedding

    def generate(self, input_ids, attention_mask=None, *, max_new_tokens, generator=None, prefill_input=None,
                 callback=None, max_batch_size=None, arrivals=None):
        self._check_budget(input_ids.shape[1], max_new_tokens)
        if arrivals is not None:  # rows joining mid-decode may bring longer prompts
            given = arrivals

            def arrivals(step, info):
                arrived = given(step, info)
                if arrived is not None:
                    self._check_budget(arrived.input_ids.shape[1], max_new_tokens)
                return arrived
        return super().generate(input_ids, attention_mask, max_new_tokens=max_new_tokens, generator=generator,
                                prefill_input=prefill_input, callback=callback, max_batch_size=max_batch_size,
                                arrivals=arrivals)

    def _check_budget(self, prompt_length: int, max_new_tokens) -> None:
        if self.position_budget is not None and isinstance(max_new_tokens, int):
            # The last step's tree reaches chain width + k positions past the newest token.
            need = prompt_length + max_new_tokens + self.width + self.k
            if need > self.position_budget:
                raise ValueError(f"num_draft_tokens k={self.k} (chain width {self.width}) is above this model's "
                                 f"position budget: prompt ({prompt_length}) + max_new_tokens ({max_new_tokens}) "
                                 f"+ width + k must be at most {self.position_budget}; lower num_draft_tokens or "
                                 "copy_draft, or max_new_tokens")

    def _verify(self, state, ctx, draft, stats):
        tree, device = register_tree(self.k, self.width), ctx.last_tokens.device
        spec = tree.spec
        nodes = spec.num_nodes + 1
        if tree.table.device != device:
            tree.table = tree.table.to(device)
        with stats.timer("verify", device):
            # Drafts past a row's length are padding, and so are the register groups hanging after them.
            tokens, positions, needed = verify_inputs(tree.table, ctx.last_tokens, draft.tokens, draft.lengths,
                                                      ctx.positions, self.target.vocab_size)
            with inject(self.registers, self.target.model, self._embedding, self.target.vocab_size):
                out = self.target.forward(state, tokens, positions, token_mask=None if bool(needed.all()) else needed,
                                          tree=spec, tree_nodes=torch.arange(nodes))
            stats.count_target_forward(tokens.shape[1])
        return self.logits.probs(out.logits[:, tree.root_and_chain.to(device)]), out

    def _keep(self, state, draft, acc):
        chain = register_tree(self.k, self.width).chain.to(acc.num_accepted.device)
        steps = torch.arange(self.width, device=chain.device)[None]
        path = torch.where(steps < acc.num_accepted[:, None], chain[None], -1)
        root = torch.zeros(path.shape[0], 1, dtype=torch.long, device=chain.device)
        self.target.keep(state, torch.cat([root, path], 1))


@register_plugin("ptp")
class PTPPlugin(Plugin):
    modality = "docs"
    lossless = True
    paper = "PTP, parallel-token prediction with register tokens (arXiv:2603.15206); scheme in plugins/ptp"
    Config = PTPConfig
    requires = PageRegions
    default_model = "doc-tiny"
    bench_default_variants = tuple({**_BENCH_ROWS, "settings": {"mode": "page", "num_draft_tokens": k}} for k in (2, 4, 8, 16))
    bench_variants = ({**_BENCH_ROWS, "settings": {"mode": "layout+regions", "num_draft_tokens": 4}},
                      {**_BENCH_ROWS, "settings": {"mode": "layout+regions", "num_draft_tokens": 4, "stream": False}},
                      {**_BENCH_ROWS, "settings": {"mode": "regions", "block_type": "table", "num_draft_tokens": 8}},
                      {**_BENCH_ROWS, "settings": {"mode": "regions", "block_type": "table", "num_draft_tokens": 8,
                                                   "copy_draft": 32}},
                      {**_BENCH_ROWS, "settings": {"mode": "page", "num_draft_tokens": 16, "copy_draft": 64}},
                      {**_BENCH_ROWS, "settings": {"mode": "page", "num_draft_tokens": 4, "temperature": 1.0}},
                      {"batch_size": 1, "num_samples": 16, "settings": {"mode": "page", "num_draft_tokens": 4}})

    def __init__(self, **config):
        super().__init__(**config)
        self._registers: RegisterSet | None = None

    def registers(self) -> RegisterSet:
        if self._registers is None:
            self._registers = load_head(RegisterSet, self.config.registers_path or BUNDLED_REGISTERS,
                                        "PTPConfig.registers_path")
            self._registers.requires_grad_(False)
        return self._registers

    def check_pipeline(self, pipeline) -> None:
        """Also: the registers must be trained for this pipeline's model, and k within what they learned."""
        super().check_pipeline(pipeline)
        registers = self.registers()
        registers.register_ids(self.config.num_draft_tokens)
        where = f"plugin 'ptp' ({self.config.registers_path or 'the bundled doc-tiny registers'})"
        model = pipeline.model
        registers.check_model(model.get_input_embeddings(), model.get_output_embeddings().weight.shape[0], model,
                              where)

    def save_pretrained(self, directory):
        self.registers().save_pretrained(directory / "ptp_registers")
        return {"registers_path": "ptp_registers"}

    @torch.no_grad()
    def bench_peer(self, pipeline, inputs, settings):
        """transformers' prompt-lookup decoding (`prompt_lookup_num_tokens=k`: drafts copied from earlier
        n-grams, the nearest training-free peer of token parallelism) on the same model, page mode, greedy,
        one page at a time (its generate takes no per-row ragged drafts)."""
        if settings.get("mode", "page") != "page" or settings.get("temperature", 0.0) != 0 \
                or not hasattr(pipeline.prompts, "type_ids"):
            return None
        model, eos = pipeline.model, pipeline.prompts.eos_token_id
        prompt = torch.tensor([pipeline.prompts.prompt("page")], device=pipeline.device)

        def generate_one(_, row):
            pixels = pipeline.processor([load_page(row["image"])]).to(pipeline.device)
            out = model.generate(input_ids=prompt, pixel_values=pixels, do_sample=False,
                                 max_new_tokens=settings["max_new_tokens"],
                                 prompt_lookup_num_tokens=self.config.num_draft_tokens, eos_token_id=eos,
                                 pad_token_id=eos)
            return cut_after(out[0, prompt.shape[1]:].tolist(), eos)

        return run_peer(model, "transformers prompt-lookup decoding", inputs, generate_one)

    def build_decoder(self, pipeline, request):
        return PTPDecoder(request.target, self.registers(), request.logits, self.config.num_draft_tokens,
                          eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id,
                          position_budget=getattr(pipeline, "max_positions", None),
                          copy_length=self.config.copy_draft)
