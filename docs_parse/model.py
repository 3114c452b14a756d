"""The page VLM: a small `transformers.GotOcr2ForConditionalGeneration`, its tokenizer, prompts and adapter.

GOT-OCR2's shape is that of the parsers users run: a ViT image encoder (SAM-style, windowed attention) whose
features two strided convolutions shrink to a few tokens, spliced into a Qwen2 decoder's input at `<image>`
placeholders. One model answers three prompts:

    page     <s> <image>×N <task_page>              -> the page's markdown </s>
    layout   <s> <image>×N <task_layout>            -> (<type_T> <loc x0> <loc y0> <loc x1> <loc y1>)* </s>
    region   <s> <image>×N <task_region> <loc>×4    -> that block's markdown </s>

Boxes are quantized to LOC_BINS bins per axis of the page (`<loc_0>` … `<loc_63>`). The tokenizer is a
byte-level BPE trained here on rendered pages' markdown (`tokenizers`), with the control tokens above
added as special tokens, and is saved as a `PreTrainedTokenizerFast` beside the model.

`PageVLMAR` adapts any such model (the bundled one, a real GOT-OCR2 checkpoint) to the core's `ARModel`:
the image features of a batch are computed once (`encode_pages`) and fed at the `<image>` positions of
each row's prompt, so many region prompts of one page reuse one encoder pass.
"""

from __future__ import annotations

import math

import torch

from mmspec.common.model import (DecodeState, HFCausalLM, ModelOutput, hf_cache_kwarg, left_align,
                                 map_dynamic_cache)
from mmspec.common.slots import SlotTable

from .pages import BLOCK_TYPES, PAGE_SIZE

LOC_BINS = 64
PAD, BOS, EOS, IMAGE = "<pad>", "<s>", "</s>", "<image>"
TASKS = ("page", "layout", "region")
# Prefixed names: a bare "<table>" would swallow the HTML tag of every table in the text.
CONTROL_TOKENS = ([PAD, BOS, EOS, IMAGE] + [f"<task_{t}>" for t in TASKS] + [f"<type_{t}>" for t in BLOCK_TYPES]
                  + [f"<loc_{i}>" for i in range(LOC_BINS)])
BPE_VOCAB = 1024  # merges learned on page text, on top of the control tokens


# --- tokenizer -------------------------------------------------------------------------------------------

def train_tokenizer(texts: list[str], vocab_size: int = BPE_VOCAB):
    """A byte-level BPE over `texts` with CONTROL_TOKENS first (ids 0 … len−1), as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size + len(CONTROL_TOKENS), special_tokens=CONTROL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   additional_special_tokens=CONTROL_TOKENS[3:])


def quantize_box(box, size: int = PAGE_SIZE) -> list[int]:
    """(x0, y0, x1, y1) pixels -> 4 bin indices (x1 / y1 rounded up, so the bins cover the box)."""
    x0, y0, x1, y1 = box
    scale = LOC_BINS / size
    lo = [min(LOC_BINS - 1, max(0, math.floor(v * scale))) for v in (x0, y0)]
    hi = [min(LOC_BINS - 1, max(0, math.ceil(v * scale) - 1)) for v in (x1, y1)]
    return [lo[0], lo[1], hi[0], hi[1]]


def dequantize_box(bins, size: int = PAGE_SIZE) -> tuple[int, int, int, int]:
    step = size / LOC_BINS
    x0, y0, x1, y1 = bins
    return (round(x0 * step), round(y0 * step), round((x1 + 1) * step), round((y1 + 1) * step))


class PagePrompts:
    """Token ids of prompts and targets for one tokenizer (the control tokens looked up once)."""

    tasks = TASKS

    def __init__(self, tokenizer, image_seq_length: int):
        self.tokenizer = tokenizer
        self.image_seq_length = image_seq_length
        ids = tokenizer.convert_tokens_to_ids(CONTROL_TOKENS)
        if any(i is None for i in ids) or (tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids):
            raise ValueError("the tokenizer lacks mmspec's page control tokens (<image>, <page>, <loc_i>, …)")
        self.id = dict(zip(CONTROL_TOKENS, ids))
        self.loc_ids = [self.id[f"<loc_{i}>"] for i in range(LOC_BINS)]
        self.type_ids = {t: self.id[f"<type_{t}>"] for t in BLOCK_TYPES}

    @property
    def eos_token_id(self) -> int:
        return self.id[EOS]

    @property
    def image_token_id(self) -> int:
        return self.id[IMAGE]

    def prompt(self, task: str, box=None) -> list[int]:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        ids = [self.id[BOS]] + [self.id[IMAGE]] * self.image_seq_length + [self.id[f"<task_{task}>"]]
        if task == "region":
            ids += [self.loc_ids[b] for b in quantize_box(box)]
        return ids

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def layout_ids(self, blocks) -> list[int]:
        out = []
        for b in blocks:
            out += [self.type_ids[b.type]] + [self.loc_ids[q] for q in quantize_box(b.box)]
        return out

    def decode_text(self, ids: list[int]) -> str:
        ids = [i for i in ids if i != self.eos_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def decode_layout(self, ids: list[int]) -> list[tuple[str, tuple[int, int, int, int]]]:
        """(type, box) per complete group of five tokens; malformed groups are skipped."""
        return self.layout_blocks(ids)[0]

    def layout_blocks(self, ids: list[int], start: int = 0) -> tuple[list[tuple[str, tuple[int, int, int, int]]], int]:
        """`decode_layout` from token `start` on, and where to resume once more tokens are out: reading a
        growing sequence piece by piece finds the same blocks as reading it whole (a layout pass's blocks can
        start their region rows while it still runs)."""
        by_type = {v: k for k, v in self.type_ids.items()}
        by_loc = {v: i for i, v in enumerate(self.loc_ids)}
        out, i = [], start
        while i + 5 <= len(ids):
            group = ids[i:i + 5]
            if group[0] in by_type and all(g in by_loc for g in group[1:]):
                out.append((by_type[group[0]], dequantize_box([by_loc[g] for g in group[1:]])))
                i += 5
            else:
                i += 1
        return out, i


class GotOcr2Prompts:
    """Prompts a real GOT-OCR2 checkpoint was trained on, built by its own `GotOcr2Processor`: the whole page
    ("OCR with format", or plain OCR with `format=False`) and box-prompted OCR of one region. GOT-OCR2 has
    no layout prompt, so a pipeline over it reads pages, or regions whose boxes the caller gives.

    Boxes are in the model's input pixels (`size` × `size`); the processor normalizes them to 0–1000 as the
    checkpoint expects. The answer ends at `<|im_end|>` (the chat turn's end), which is the end token."""

    tasks = ("page", "region")

    def __init__(self, processor, image_seq_length: int, size: int, format: bool = True):
        self.processor, self.tokenizer = processor, processor.tokenizer
        self.image_seq_length, self.size, self.format = image_seq_length, size, format
        self.image_token_id = processor.image_token_id
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if eos is None or eos == self.tokenizer.unk_token_id:
            raise ValueError("the GOT-OCR2 tokenizer lacks <|im_end|>, the end of its answers")
        self.eos_token_id = eos
        self._cache = {}

    def prompt(self, task: str, box=None) -> list[int]:
        if task not in self.tasks:
            raise ValueError(f"task must be one of {self.tasks} for a GOT-OCR2 checkpoint (it has no layout "
                             f"prompt), got {task!r}")
        key = (task, tuple(box) if task == "region" else None)
        if key not in self._cache:
            from PIL import Image

            blank = Image.new("RGB", (self.size, self.size), "white")  # the prompt depends on the size only
            inputs = self.processor(images=blank, box=list(key[1]) if key[1] else None, format=self.format,
                                    num_image_tokens=self.image_seq_length)
            self._cache[key] = [int(i) for i in inputs["input_ids"][0]]
        return list(self._cache[key])

    def decode_text(self, ids: list[int]) -> str:
        ids = [i for i in ids if i != self.eos_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()


class GotOcr2PixelProcessor:
    """Page images -> pixel_values with a GOT-OCR2 checkpoint's own image processor (one tile per page)."""

    def __init__(self, image_processor):
        self.image_processor = image_processor
        size = image_processor.size  # a dict-like {"height", "width"} (square for GOT-OCR2)
        self.size = int(size["height"]) if hasattr(size, "__getitem__") else int(size)

    def __call__(self, images) -> torch.Tensor:
        return self.image_processor([im.convert("RGB") for im in images], crop_to_patches=False,
                                    return_tensors="pt")["pixel_values"]


# --- the bundled model ------------------------------------------------------------------------------------

def tiny_got_config(vocab_size: int, image_token_id: int, pad_token_id: int = 0, text_hidden: int = 256,
                    text_layers: int = 4, vision_hidden: int = 128, vision_layers: int = 3):
    """The bundled page VLM's config: 320 px pages in 10 px patches (32×32), 64 image tokens, Qwen2 text."""
    from transformers import GotOcr2Config

    patch = 10
    grid = PAGE_SIZE // patch
    return GotOcr2Config(
        vision_config=dict(hidden_size=vision_hidden, output_channels=vision_hidden, num_hidden_layers=vision_layers,
                           num_attention_heads=4, image_size=PAGE_SIZE, patch_size=patch, window_size=16,
                           global_attn_indexes=[vision_layers - 1], mlp_dim=4 * vision_hidden, use_rel_pos=False,
                           initializer_range=0.02),  # the class default (1e-10, for loading SAM weights) starts a
                                                      # from-scratch encoder at zero
        text_config=dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=text_hidden,
                         intermediate_size=3 * text_hidden, num_hidden_layers=text_layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=pad_token_id,
                         tie_word_embeddings=True),
        image_token_index=image_token_id, image_seq_length=(grid // 4) ** 2, tie_word_embeddings=True)


class PageImageProcessor:
    """Page images -> pixel_values [B, C, S, S]: grey pages resized to the model's square input size and
    normalized (mean / std per channel, as the model was trained)."""

    def __init__(self, size: int = PAGE_SIZE, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
        self.size, self.mean, self.std = size, tuple(mean), tuple(std)

    def to_dict(self) -> dict:
        return {"size": self.size, "mean": list(self.mean), "std": list(self.std)}

    def __call__(self, images) -> torch.Tensor:
        import numpy as np
        from PIL import Image

        out = []
        for image in images:
            rgb = image.convert("RGB")
            if rgb.size != (self.size, self.size):
                rgb = rgb.resize((self.size, self.size), Image.BICUBIC)
            out.append(torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1))
        pixels = torch.stack(out)
        mean = torch.tensor(self.mean)[None, :, None, None]
        std = torch.tensor(self.std)[None, :, None, None]
        return (pixels - mean) / std


# --- the adapter ------------------------------------------------------------------------------------------

def encode_pages(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """[B, C, S, S] -> [B, N, D] the image tokens the decoder reads (encoder + projector), once per page."""
    param = next(model.parameters())
    feats = model.model.get_image_features(pixel_values=pixel_values.to(param.device, param.dtype))
    return feats.pooler_output if hasattr(feats, "pooler_output") else feats


class PageVLMAR(HFCausalLM):
    """`ARModel` over a GOT-OCR2-style VLM for a batch of prompts whose `<image>` placeholders are filled
    from `image_features[row_pages[b]]` ([P, N, D], N = placeholders per prompt): rows may share a page.
    Only the decoder runs per step; the vision tower ran once in `encode_pages`. Rows may join a running
    batch (`append_rows`; `add_requests` for requests that arrive mid-decode, such as region branches).

    shared_prefix: prompts that agree on their first `shared_prefix` tokens (a page's region prompts) run
    that prefix once per page, in whichever prefill first needs it, and every later row of the page forks it;
    0 shares only among the rows of one prefill."""

    def __init__(self, model, image_features: torch.Tensor, row_pages: torch.Tensor, image_token_id: int,
                 compact_slack: int = 64, shared_prefix: int = 0):
        super().__init__(model, compact_slack)
        self.shared_prefix = shared_prefix  # prompts that agree on this many leading tokens share their KV
        self.language_model = model.model.language_model
        self._cache_kwarg = hf_cache_kwarg(self.language_model)
        self.lm_head = model.lm_head
        self.image_features = image_features
        self.row_pages = row_pages.to(image_features.device)  # request -> page
        self.image_token_id = image_token_id
        self._prefill_requests: torch.Tensor | None = None
        self._prefixes: dict = {}  # (prefix ids, page) -> a one-row state holding that page's prefix KV

    def add_requests(self, pages) -> None:
        """Requests that join the call after the given ones read these pages (one per request)."""
        pages = torch.as_tensor(pages, dtype=torch.long, device=self.row_pages.device)
        self.row_pages = torch.cat([self.row_pages, pages])

    def set_prefill_requests(self, requests: torch.Tensor) -> None:
        self._prefill_requests = requests.to(self.device)

    def _requests(self, batch_size: int) -> torch.Tensor:
        requests = self._prefill_requests
        if requests is None or requests.numel() != batch_size:
            return torch.arange(batch_size, device=self.device)
        return requests

    def new_state(self, batch_size: int) -> DecodeState:
        return self._state_for(self._requests(batch_size))

    def _state_for(self, requests: torch.Tensor) -> DecodeState:
        """An empty state whose rows are `requests` (indices into row_pages)."""
        from transformers import DynamicCache

        batch_size = requests.numel()
        state = DecodeState(cache=DynamicCache(config=self.config.text_config),
                            slots=SlotTable.empty(batch_size, self.device))
        state.extra = {"rows": requests,  # this state's rows -> requests -> row_pages
                       "placed": torch.zeros(batch_size, dtype=torch.bool, device=self.device)}
        return state

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        tokens = tokens.to(self.device)
        embeds = self.language_model.get_input_embeddings()(tokens)
        # A row's image is spliced once, from its prompt; an <image> id the model generates (or a draft of it)
        # afterwards is embedded as a plain token, as GOT-OCR2's own generate does.
        placed = state.extra["placed"]
        is_image = (tokens == self.image_token_id) & ~placed[:, None]
        if bool(is_image.any()):
            counts = is_image.sum(1)
            n = self.image_features.shape[1]
            if bool(((counts != 0) & (counts != n)).any()):
                raise ValueError(f"each prompt needs exactly {n} <image> tokens (the model's image_seq_length), "
                                 f"got {counts.tolist()}")
            pages = self.row_pages[state.extra["rows"]]
            feats = self.image_features[pages[counts > 0]].reshape(-1, embeds.shape[-1])
            embeds = embeds.masked_scatter(is_image[..., None], feats.to(embeds.dtype))
            state.extra["placed"] = placed | (counts > 0)
        out = self.language_model(inputs_embeds=embeds, position_ids=positions.to(self.device),
                                  attention_mask=mask4d.to(self.device), use_cache=True,
                                  **{self._cache_kwarg: state.cache})
        hidden = out.last_hidden_state
        return ModelOutput(logits=self.lm_head(hidden).float(), hidden=hidden if output_hidden else None)

    def input_embedding_module(self):
        return self.language_model.get_input_embeddings()

    def prefill(self, input_ids, attention_mask=None, output_hidden=False):
        """Prompts that start alike (a page's region prompts: `<s> <image>×N <task_region>`, then each block's
        box) share that prefix's KV per page: it runs once per page and prefix, is kept, and is forked to
        every row reading that page, now or in a later prefill (rows admitted mid-decode), and only the rest
        of each prompt is fed. The result equals prefilling every row whole (tested); prompts with no common
        unpadded prefix are prefilled whole."""
        ids, mask, _ = left_align(input_ids, attention_mask, allow_empty=True)
        requests = self._requests(ids.shape[0])
        length = self._prefix_length(ids, mask, requests)
        if output_hidden or length == 0:
            return super().prefill(input_ids, attention_mask, output_hidden)
        ids, device = ids.to(self.device), self.device
        state = self._fork_prefixes(ids[0, :length], requests)
        state.extra["rows"] = requests
        if ids.shape[1] == length:
            return state, None
        positions = torch.arange(length, ids.shape[1], device=device).expand(ids.shape[0], -1)
        return state, self.forward(state, ids[:, length:], positions)

    def _prefix_length(self, ids: torch.Tensor, mask: torch.Tensor, requests: torch.Tensor) -> int:
        """How many leading tokens to take from per-page prefix KV: `shared_prefix` when every row has those
        alike; else, when some page has two or more rows, every column all rows have alike and unpadded;
        else 0 (prefill whole)."""
        if ids.shape[1] == 0 or not bool(mask.all()):
            return 0
        same = (ids == ids[:1]).all(0)
        common = int(same.long().cumprod(0).sum())  # columns equal across every row, from the start
        if self.shared_prefix and common >= self.shared_prefix:
            return self.shared_prefix
        if self.row_pages[requests].unique().numel() == ids.shape[0]:
            return 0  # one row per page: nothing to share
        return common

    def _fork_prefixes(self, prefix: torch.Tensor, requests: torch.Tensor) -> DecodeState:
        """A state whose row b holds the KV of `prefix` over request b's page: pages not seen with this prefix
        yet run it in one forward (kept for later prefills), then every row continues a copy of its page's."""
        import copy

        key = tuple(prefix.tolist())
        pages = self.row_pages[requests].tolist()
        missing = [p for p in dict.fromkeys(pages) if (key, p) not in self._prefixes]
        if missing:
            leaders = torch.tensor([int(requests[pages.index(p)]) for p in missing], device=self.device)
            state = self._state_for(leaders)
            positions = torch.arange(len(key), device=self.device).expand(len(missing), -1)
            self.forward(state, prefix.expand(len(missing), -1), positions)
            for i, page in enumerate(missing):
                one = copy.deepcopy(state)
                self.select_rows(one, torch.tensor([i], device=self.device))
                self._prefixes[(key, page)] = one
        order = list(dict.fromkeys(pages))
        state = copy.deepcopy(self._prefixes[(key, order[0])])
        for page in order[1:]:
            self.append_rows(state, copy.deepcopy(self._prefixes[(key, page)]))
        self.select_rows(state, torch.tensor([order.index(p) for p in pages], device=self.device))
        return state

    def select_rows(self, state, rows):
        state.extra["rows"] = state.extra["rows"][rows.to(self.device)]
        state.extra["placed"] = state.extra["placed"][rows.to(self.device)]
        super().select_rows(state, rows)

    def append_rows(self, state, other):
        state.extra = {name: torch.cat([state.extra[name], other.extra[name]]) for name in ("rows", "placed")}
        super().append_rows(state, other)

    def _map_kv(self, state, fn):
        map_dynamic_cache(state.cache, fn)
